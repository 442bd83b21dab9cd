"""Makes docs/names-test.tsv, a test set of names a model has never seen: does the model copy them verbatim?

    python tools/names_test_set.py [--data fra-eng.zip] [--out docs/names-test.tsv]

How the set is made, and why nothing in it is trained on or used to choose a model:

1. The names are real first names of many languages (CANDIDATES below, written by hand; people's names, which French
   keeps as they are, not places with a French name of their own such as London/Londres).
2. A name is kept only if the held-out rule reserves it (toolkit.core.noise.is_held_out_name: crc32 % 10 == 0), so no
   substitution made in training (the robustness noise's generated names, the copy pairs of toolkit.core.copydata)
   can ever produce it, and only if it occurs nowhere in the corpus, in any split, on either side, in any case.
3. Each name takes the place of the stock name (Tom, Mary, ...) in one sentence pair of the held-out test split (never
   trained on; model choice uses the validation split), on both sides, with French elision (`de Tom` -> `d'Aoife`).
   The pairs are those whose stock name occurs once on each side and that name no one else; one pair per name, drawn
   with a fixed seed.

tests/pytorch/test_recipe_student.py rebuilds the file from the corpus and checks it is this script's output, and checks each
rule above. Scored by `tk evaluate DIR --names docs/names-test.tsv` (toolkit/deploy/names.py).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit.core import data, noise  # noqa: E402
from toolkit.core.copydata import _word, names_in, substitute  # noqa: E402

SEED = 41
MAX_WORDS = 10
CANDIDATES = """
Alexander Maximilian Bartholomew Leopold Augustin Florian Benedikt Ludwig Gottfried Wolfgang Siegfried Reinhard
Dietrich Anneliese Brunhilde Gretchen Liesel Hildegard Waltraud Ingeborg Friedrich Konstantin Thorvald Sigrid
Astrid Ingrid Solveig Ragnhild Gunnar Bjarne Torbjorn Eirik Halvard Sindre Ylva Liv Maja Freja Signe Dagny Tove
Henrik Mikkel Soren Jorgen Kasper Rasmus Anders Leif Sven Oskar Nils Einar Ulrik Dmitri Vladimir Yaroslav
Svetlana Lyudmila Anastasia Ekaterina Tatiana Oksana Bogdan Miroslav Radoslav Zdenek Jaroslav Wojciech Krzysztof
Grzegorz Malgorzata Agnieszka Katarzyna Przemyslaw Bozena Zbigniew Stanislaw Vaclav Tomas Jiri Zuzana Ludmila
Milena Dragan Goran Zoran Vesna Jelena Snezana Nikola Branko Milos Dusan Ljubomir Radovan Stojan Borislav
Kaloyan Dimitar Todor Stoyan Ivanka Rumen Tsvetan Giuseppe Salvatore Gennaro Vincenzo Massimo Maurizio Gianluca
Pierluigi Donatella Ornella Raffaella Fiorella Loredana Benedetta Ludovica Gaetano Corrado Ottavio Rosalba
Carmela Annunziata Filippo Lorenzo Niccolo Alejandro Guillermo Rodrigo Gonzalo Fernando Ignacio Esteban Joaquin
Leonardo Rafael Santiago Ximena Guadalupe Consuelo Milagros Araceli Remedios Inmaculada Itziar Ainhoa Iker Unai
Aitor Gorka Koldo Xabier Arantxa Joaquim Gonçalo Rodrigues Leopoldina Valdemar Wanderley Adalberto Gilberto
Jurandir Raimundo Thiago Vinicius Rosangela Luciana Fabiana Juliana Marcelo Gustavo Leandro Cristiano Anderson
Dimitrios Konstantinos Panagiotis Athanasios Vasilis Stavros Spyros Evangelos Chrysoula Paraskevi Eleftheria
Panagiota Despina Kalliope Theodora Anastasios Yiannis Nikos Kostas Mehmet Mustafa Emre Burak Serkan Tolga
Volkan Cemal Kemal Ozan Ayse Fatma Emine Zeynep Elif Gulsen Sevgi Nurhan Yildiz Ebru Deniz Aylin Dilek Hakan
Erdem Murat Selim Abdullah Mohammed Khalid Tariq Rashid Faisal Yousef Samir Nabil Karim Hamza Bilal Walid Zainab
Fatima Aisha Khadija Yasmin Layla Noura Salma Hoda Mariam Rania Dalia Amira Soraya Leila Dariush Farhad Kourosh
Babak Behrouz Mehrdad Shirin Parisa Golnaz Mahsa Niloufar Roya Azadeh Farnaz Arash Kaveh Siavash Ardeshir Bahram
Rajesh Suresh Ramesh Mahesh Dinesh Ganesh Venkatesh Srinivas Lakshmi Priya Ananya Deepika Kavita Sunita Anjali
Pooja Nandini Shreya Aishwarya Arjun Rohan Vikram Siddharth Aditya Karthik Pranav Harish Gopal Mohan Wei
Xiaoming Zhiqiang Jianguo Yongmei Xiuying Guiying Lihua Meiling Haoran Zihan Yichen Junjie Qiang Zhenyu Xinyi
Ruolan Shuang Mingzhu Tianyu Hongwei Bingbing Haruto Takumi Kenta Shota Daiki Yuto Sota Haruka Yui Misaki Ayaka
Nanami Sakura Hikari Kaori Megumi Tomoko Naoko Yoshiko Hiroshi Takeshi Masaru Kazuo Shigeru Akira Takeru Ryota
Minjun Seojun Jiwoo Hyunwoo Dohyun Seoyeon Jiyoon Haeun Minseo Yerin Sooyoung Jihoon Taeyang Eunji Hyejin
Kyungsoo Sunghoon Oluwaseun Adebayo Chukwuemeka Chinonso Ngozi Oluwadamilare Folasade Olumide Temitope Ayodele
Babatunde Obinna Ifeoma Nnamdi Chiamaka Uchenna Kelechi Emeka Tunde Yetunde Bukola Thandiwe Sipho Themba Nomvula
Lindiwe Bongani Mandla Zanele Thabo Lerato Kagiso Palesa Tshepo Nkosinathi Sibusiso Ayanda Lwazi Wanjiru Njeri
Kamau Otieno Achieng Akinyi Odhiambo Wambui Mwangi Kipchoge Cheruiyot Jepkosgei Kiprotich Barasa Nyambura
Siobhan Niamh Aoife Caoimhe Saoirse Grainne Ciaran Padraig Oisin Cillian Eoghan Donnacha Ruairi Tadhg Fionnuala
Sinead Clodagh Eimear Orla Gwyneth Rhiannon Angharad Bronwen Eluned Gethin Rhodri Dafydd Iestyn Llywelyn Cerys
Ffion Seren Meredydd Emrys Tegwen Zsuzsanna Erzsebet Gyorgy Laszlo Istvan Zoltan Tibor Gyula Sandor Ildiko
Krisztina Eniko Agota Zsofia Bence Levente Botond Pirjo Tuulikki Aino Eetu Juhani Jukka Pekka Tapio Raimo Sirpa
Marjatta Kaarina Ilmari Veikko Onni Aukusti Raimonds Valdis Gintaras Vytautas Arvydas Ruta Egle Ausra Ieva Laima
Dainis Kristaps Janis Inese Baiba Kalani Keanu Makoa Leilani Kainoa Malia Moana Tamatea Wiremu Aroha Hemi Rangi
Mere Tane Anahera Ngaire Tui Aurelio Casimiro Evaristo Fulgencio Hermenegildo Isidoro Leocadio Marcelino Nicanor
Prudencio Saturnino Teodoro Venancio Zacarias Bartolomeo Cipriano Ermenegildo Girolamo Ippolito Lodovico
Policarpo Tommaso Ubaldo Vittorio Barnabas Cornelius Ignatius Lucius Octavius Quintus Septimus Thaddeus Ambrose
Cuthbert Eustace Fitzgerald Leofric Oswald Percival Reginald Wilfred Winifred Mildred Gertrude Ethelbert
Algernon Montague Peregrine Anselm Dagobert Hieronymus Kunibert Leberecht Ottokar Wendelin Ambrosius Gottlieb
Traugott Xiadani Citlali Itzel Yatzil Nayeli Tonatiuh Cuauhtemoc Xochitl Tlaloc Izel Desmond Dorian Fenwick
Gideon Lysander Thelonious Ulysses Zebedee Ezekiel Jedediah Obadiah Malachi Zachariah Jeremiah Nehemiah Hezekiah
Ottilie Ludmilla Wilhelmina Philippa Evangeline Seraphina Theodosia Araminta Clementine Cordelia Ophelia
Persephone Rosalind Guinevere Imogen Henrietta Millicent Prudence Benedek Szilveszter Orsolya Boglarka Piroska
Ramunas Giedre Audrius Darius Saulius Tomasz Bartosz Mateusz Jedrzej Szymon
""".split()


def corpus_words(pairs: list[tuple[str, str]]) -> set[str]:
    """Every word of the corpus, lowercased."""
    import re

    return set(re.findall(r"\w+", "\n".join(f"{en} {fr}" for en, fr in pairs).lower()))


def unseen_names(pairs: list[tuple[str, str]], words: set[str] | None = None) -> list[str]:
    words = corpus_words(pairs) if words is None else words
    return [c for c in dict.fromkeys(CANDIDATES) if noise.is_held_out_name(c) and c.lower() not in words]


def eligible(pairs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(stock name, English, French) of the test split's pairs that name one stock character once on each side and
    no one else, in at most MAX_WORDS English words."""
    stock = set(noise.STOCK_NAMES)
    out = set()
    for en, fr in pairs:
        if data.split_of(en) != "test" or len(en.split()) > MAX_WORDS:
            continue
        found = names_in(en, fr, stock)
        others = set(names_in(en, fr)) - stock
        if len(found) == 1 and not others and len(_word(found[0]).findall(en)) == 1 and len(_word(found[0]).findall(fr)) == 1:
            out.add((found[0], en, fr))
    return sorted(out)


def build(pairs: list[tuple[str, str]], words: set[str] | None = None) -> list[tuple[str, str, str, str]]:
    """(name, stock, English, French) rows: one held-out pair per unseen name, each English sentence once."""
    rng = random.Random(SEED)
    pool = eligible(pairs)
    rng.shuffle(pool)
    rows, used = [], set()
    for name in unseen_names(pairs, words):
        stock, en, fr = next(p for p in pool if p[1] not in used)
        used.add(en)
        rows.append((name, stock, substitute(en, stock, name), substitute(fr, stock, name, french=True)))
    return rows


def render(rows, corpus_sha256: str) -> str:
    head = [
        "# A test set of unseen names (is a name copied verbatim?): name<TAB>stock name it replaced<TAB>English<TAB>French.",
        f"# Made by `python tools/names_test_set.py` from fra-eng.zip (fra.txt sha256 {corpus_sha256[:16]}...): real first",
        "# names reserved by toolkit.core.noise.is_held_out_name and absent from the corpus, each in one held-out test-split",
        "# pair in place of its stock name. Evaluation only: `tk evaluate DIR --names docs/names-test.tsv`.",
        "# Sentences from Tatoeba (tatoeba.org, CC BY 2.0 FR), via manythings.org/anki.",
    ]
    return "\n".join(head + ["\t".join(r) for r in rows]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="fra-eng.zip [default: tk's corpus search]")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "names-test.tsv")
    args = parser.parse_args()
    pairs, digest = data.read_pairs(data.locate(args.data, download=False))
    rows = build(pairs)
    args.out.write_text(render(rows, digest), encoding="utf-8")
    print(f"{len(rows)} names written to {args.out}")


if __name__ == "__main__":
    main()
