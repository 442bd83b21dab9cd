"""Constrained decoding: a translation that holds given target terms, for glossaries (toolkit.core.glossary).

Dynamic beam allocation (Post & Vilar 2018), one sentence at a time over a step backend (toolkit.core.decoding). Each
hypothesis records which terms it has written and how far into the one it is writing. At each step its candidates
are the model's `beam` best tokens, the next token of the term it is writing, and the first token of each term it has
not written (after an apostrophe, of the term's form glued to the elided word: "l'automobile"); the end token is
allowed once every term is written, right after a term the next token must begin a word, so no suffix is glued to it
("automobile" + "s"), and a hypothesis whose sentence has ended (".", "?") without its terms is dropped, so none is
tacked on after the full stop. Candidates are ranked in banks by how many term tokens they hold and each bank gets its
share of the beam (the rest goes to the best of any bank), so hypotheses that have written a term live on beside
better-scored ones that have not yet. Where the search's best only adds a term beside the model's own word for it,
term_swaps give the model's own translation with that word swapped for the term instead ("voiture" -> "automobile").

The model writes the words around the term as it would around its own choice ("sa chambre", "une bicyclette"), which
a placeholder in its place does not let it do. What comes out is checked by the caller (toolkit.deploy.translate._forced):
a translation that does not hold each term exactly as often as asked, or that only adds the terms to the model's own
words, is not used. Torch-free.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from toolkit.core.declaration import DecodingRules
from toolkit.core.decoding import Hypothesis, StepBackend, loop_cut, pad_batch


@dataclass(frozen=True)
class _Hyp:
    tokens: tuple[int, ...]
    score: float  # summed log-probability
    met: tuple[bool, ...]  # per term: written
    writing: tuple[int, int, int] | None  # (term, its form, tokens of it written so far) while one is being written
    after_term: bool  # the last token ended a term: the next must begin a word
    held: int = 0  # term tokens it holds (the terms written, and the part of the one being written): its bank


def _advance(h: _Hyp, tok: int, score: float, terms: list[list[list[int]]], elided: bool) -> _Hyp:
    """h with `tok` written; elided: h's last token ends in an apostrophe, where a term's glued form may begin."""
    met, writing, held = list(h.met), None, h.held
    if h.writing:
        c, v, j = h.writing
        if terms[c][v][j] == tok:
            writing, held = (c, v, j + 1), held + 1
        else:  # a term left unfinished counts for nothing; it may be started again, from here or later
            held -= j
    if writing is None:
        writing = next(((c, v, 1) for c, forms in enumerate(terms) if not met[c]
                        for v, form in enumerate(forms) if form[0] == tok and (v > 0) == elided), None)
        held += writing is not None
    ended = writing is not None and writing[2] == len(terms[writing[0]][writing[1]])
    if ended:
        met[writing[0]] = True
        writing = None
    return _Hyp(h.tokens + (tok,), score, tuple(met), writing, ended, held)


# The letters a word an article is elided before begins with (French, Italian, Catalan: "l'automobile", "l'hôtel").
ELIDES = "aeiouyhàâäéèêëîïôöùûüœæ"


def term_forms(tokenizer, target: str, end: int) -> list[list[int]]:
    """A target term's token ids as a word of its own ("▁auto mo b il e"), and, for a target an article is elided before
    (ELIDES), as the tokenizer writes it glued to an elided word ("l'automobile": "▁l ' au t o mo b il e"). After an
    elided word only that form may begin, so a target that takes no elision never follows one ("de l' fric"): the model
    writes its article. An end token the tokenizer appends (`end`: an imported model's tokenizer ends each text with it)
    is no part of either."""
    alone, prefix, glued = (ids[:-1] if ids[-1:] == [end] else ids for ids in tokenizer.target_ids([target, "l'", f"l'{target}"]))
    after = glued[len(prefix):]
    return [alone, after] if target[:1].casefold() in ELIDES and glued[: len(prefix)] == prefix and after else [alone]


_SENTENCE_ENDS = {".", "?", "!", "…"}


@functools.lru_cache(maxsize=8)
def _piece_kinds(tokenizer, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per output id: whether it begins a word (or is punctuation), what may follow a term; whether it ends in an
    apostrophe, where a term's glued form may begin; whether it ends a sentence ("." "▁?"), after which no term
    may begin; whether it is an apostrophe alone ("'" after "▁l"), which begins no word of its own; and whether it is
    a word that is only ever written elided (ELISION_STUBS: "▁l" before its "'"), after which no term may begin as a
    word of its own ("l fric")."""
    pieces = [tokenizer.piece(i) for i in range(vocab)]
    starts = np.array([tokenizer.begins_word(i) for i in range(vocab)], dtype=bool)
    return (starts,
            np.array([p.endswith(("'", "’")) for p in pieces], dtype=bool),
            np.array([p.lstrip("\u2581") in _SENTENCE_ENDS for p in pieces], dtype=bool),
            np.array([bool(p) and not p.strip("'’") for p in pieces], dtype=bool),
            starts & np.array([p.lstrip("\u2581Ġ").casefold() in ELISION_STUBS for p in pieces], dtype=bool))


def can_constrain(backend: object, rules: DecodingRules) -> bool:
    """Whether this backend runs tk's own decoding loop step by step (CTranslate2 decodes whole sentences in its own),
    with a model that begins from its start token alone (no forced language token)."""
    return isinstance(backend, StepBackend) and rules.forced_first is None


def _candidates(h: _Hyp, log_probs: np.ndarray, terms: list[list[list[int]]], beam: int, starts: np.ndarray, eos: int,
                elided: bool, stub: bool = False) -> list[int]:
    """A hypothesis's next tokens to weigh: the model's `beam` best that it may write, the next token of the term it is
    writing, the first of each term it has not written (its glued form after an apostrophe: term_forms; none as a word
    of its own right after a word only ever written elided, `stub`: "l fric"), and the end token once every term is
    written."""
    lp = log_probs
    unwritten = [forms for forms, m in zip(terms, h.met) if not m]
    if h.after_term or unwritten or stub:
        lp = log_probs.copy()
        if h.after_term:
            lp[~starts] = -np.inf
            lp[eos] = log_probs[eos]
        if unwritten:
            lp[eos] = -np.inf
        if stub:
            lp[[forms[0][0] for forms in unwritten]] = -np.inf
    wanted = set(np.argpartition(-lp, beam)[:beam].tolist())
    if h.writing:
        c, v, j = h.writing
        wanted.add(terms[c][v][j])
    wanted.update(form[0] for forms in unwritten for v, form in enumerate(forms) if (v > 0) == elided and not (stub and v == 0))
    if all(h.met):
        wanted.add(eos)
    return [t for t in wanted if np.isfinite(lp[t])]


def _allocate(going: list[tuple[int, _Hyp]], terms: list[list[list[int]]], beam: int) -> list[tuple[int, _Hyp]]:
    """The `beam` hypotheses that live on: each bank's best (its share of the beam, most term tokens first), then the
    best of the others; best first."""
    banks: dict[int, list[tuple[int, _Hyp]]] = {}
    for item in going:  # best first
        banks.setdefault(item[1].held, []).append(item)
    share = max(1, beam // (sum(len(forms[0]) for forms in terms) + 1))
    chosen = [item for b in sorted(banks, reverse=True) for item in banks[b][:share]]
    chosen = sorted(chosen, key=lambda item: -item[1].score)[:beam]
    picked = {id(item) for item in chosen}
    chosen += [item for item in going if id(item) not in picked][: beam - len(chosen)]
    return sorted(chosen, key=lambda item: -item[1].score)


def constrained_search(backend: StepBackend, tokenizer, src: list[int], terms: list[list[list[int]]], limit: int, beam: int,
                       alpha: float, rules: DecodingRules, n_best: int = 1) -> list[Hypothesis]:
    """The best translations of `src` (token ids) that hold each of `terms` (one per occurrence, each its forms' token
    ids: term_forms), at most `limit` tokens long, by dynamic beam allocation with `beam` rows (at least n_best): up to
    `n_best` of them, best first, none that loops; [] if none finished or the best loops."""
    return constrained_searches(backend, tokenizer, [(src, terms, limit)], beam, alpha, rules, n_best)[0]


@dataclass
class _Search:
    """One sentence's constrained search as constrained_searches advances it: its terms, step limit, live hypotheses
    (one decoder row each) and finished ones."""

    terms: list[list[list[int]]]
    limit: int
    hyps: list[_Hyp]
    finished: list[tuple[float, _Hyp]]
    done: bool = False


def constrained_searches(backend: StepBackend, tokenizer, items: list[tuple[list[int], list[int], int]], beam: int, alpha: float,
                         rules: DecodingRules, n_best: int = 1, rows: int = 64) -> list[list[Hypothesis]]:
    """constrained_search of each (src, terms, limit), the sentences searched side by side, up to `rows` decoder rows a
    batch: each sentence's hypotheses are its own rows of one decoder step, so a sentence gets what it gets alone (rows
    are independent), at one decoder call a step for many sentences instead of one each (glossary lines of a file: 7,307
    calls of 4 rows for 287 sentences, most of the search's time)."""
    per_batch = max(1, rows // beam)
    out: list[list[Hypothesis]] = []
    for first in range(0, len(items), per_batch):
        out += _search_batch(backend, tokenizer, items[first:first + per_batch], beam, alpha, rules, n_best)
    return out


def _search_batch(backend: StepBackend, tokenizer, items: list[tuple[list[int], list[int], int]], beam: int, alpha: float,
                  rules: DecodingRules, n_best: int) -> list[list[Hypothesis]]:
    """constrained_searches of one batch: dynamic beam allocation per sentence (_allocate), over one decoder state."""
    state = backend.encode(*pad_batch([src for src, _, _ in items], rules.pad))
    eos = rules.end
    searches = [_Search(terms, limit, [_Hyp((), 0.0, (False,) * len(terms), None, False)], []) for _, terms, limit in items]
    token = np.full(len(items), rules.start, dtype=np.int64)
    kinds = None
    step = 0
    while True:
        log_probs, state = backend.step(token, state)
        starts, apostrophes, ends, _, stubs = kinds = kinds or _piece_kinds(tokenizer, log_probs.shape[1])
        step += 1
        keep: list[int] = []  # the decoder rows that live on, sentence after sentence
        row = 0
        for search in searches:
            if search.done:
                continue
            first, row = row, row + len(search.hyps)
            if step > search.limit:  # a limit of no tokens: nothing found, as a search that never steps
                search.done = True
                continue
            live = _search_step(search, log_probs[first:row], beam, alpha, rules, starts, apostrophes, ends, stubs, eos)
            if live and step < search.limit:
                search.hyps = [h for _, h in live]
                keep += [first + r for r, _ in live]
            else:
                search.done = True
        if not keep:
            break
        state = backend.select(state, np.array(keep, dtype=np.int64))
        token = np.array([h.tokens[-1] for search in searches if not search.done for h in search.hyps], dtype=np.int64)
    return [_best_finished(search.finished, n_best) for search in searches]


def _search_step(search: _Search, log_probs: np.ndarray, beam: int, alpha: float, rules: DecodingRules, starts: np.ndarray,
                 apostrophes: np.ndarray, ends: np.ndarray, stubs: np.ndarray, eos: int) -> list[tuple[int, _Hyp]]:
    """One step of one sentence's search (its rows' log-probabilities): the finished hypotheses kept, and the live ones
    (row, hypothesis) that go on, best first; [] once it is over (a beam's worth finished, or nothing left)."""
    terms = search.terms
    candidates = []
    for r, h in enumerate(search.hyps):
        if h.tokens and ends[h.tokens[-1]] and not all(h.met):
            # Its sentence ended without its terms: what it could still write is a term tacked on ("... grandi. demeure.").
            continue
        elided = bool(h.tokens) and bool(apostrophes[h.tokens[-1]])
        stub = bool(h.tokens) and bool(stubs[h.tokens[-1]])
        candidates += [(r, _advance(h, tok, h.score + float(log_probs[r, tok]), terms, elided))
                       for tok in _candidates(h, log_probs[r], terms, beam, starts, eos, elided, stub)]
    candidates.sort(key=lambda item: -item[1].score)
    # An end token finishes its hypothesis where it ranks within the beam, as in tk's beam search.
    for _, h in candidates[:beam]:
        if h.tokens[-1] == eos:
            search.finished.append((rules.normalized(h.score, len(h.tokens) - 1, alpha), h))
    if len(search.finished) >= beam:
        return []
    return _allocate([item for item in candidates if item[1].tokens[-1] != eos], terms, beam)


def _best_finished(finished: list[tuple[float, _Hyp]], n_best: int) -> list[Hypothesis]:
    """Up to n_best finished hypotheses, best first (the first of equals first), none that loops; [] if the best loops."""
    out: list[Hypothesis] = []
    for _, h in sorted(finished, key=lambda f: -f[0]):
        tokens = list(h.tokens[:-1])
        if tokens and loop_cut(np.array([tokens]))[0] >= 0:
            if not out:
                return []
            continue
        out.append(Hypothesis(tokens, h.score))
        if len(out) == n_best:
            break
    return out


@dataclass(frozen=True)
class TermWord:
    """Where the model's own word for a term stands in its translation `own` (ids): own[begin:end], `i` where the word
    itself begins (after an elided article: "l'" of "l'argent" begins at `begin`), and its text."""

    begin: int
    i: int
    end: int
    elided: bool
    text: str


def term_words(backend: StepBackend, tokenizer, items: list[tuple[list[int], list[int], list[int]]], rules: DecodingRules,
               rows: int = 64) -> list[TermWord | None]:
    """For each (src, own, without): where the word of the model's own translation `own` (token ids) that the source
    terms account for most stands, the one whose log-probability falls most when the model reads `without` (the source
    with its terms taken out) instead of `src` (the first of equals); None where `own` has no word. An apostrophe alone
    continues its word. The readings of many sentences go in padded batches of up to `rows`: a glossary's sentences
    pay one decoder run a token for all of them, not two readings each."""
    out: list[TermWord | None] = []
    for at in range(0, len(items), max(1, rows // 2)):
        chunk = items[at: at + max(1, rows // 2)]
        reads, vocab = _read_each(backend, [x for src, _, without in chunk for x in (src, without)],
                                  [own for _, own, _ in chunk for _ in (0, 1)], rules)
        out += [_word_of(tokenizer, own, reads[2 * k] - reads[2 * k + 1], vocab) for k, (_, own, _) in enumerate(chunk)]
    return out


def _word_of(tokenizer, own: list[int], fall: np.ndarray, vocab: int) -> TermWord | None:
    """The word of `own` whose tokens' log-probabilities fall most (`fall`, per token), the first of equals; never an
    article or determiner (NOT_A_TERMS_WORD): where the term's word has a gender, the article before it falls with it,
    at times more ("de" in "mon numéro de téléphone", "le" in "avant le dîner")."""
    if len(own) < 2:
        return None
    starts, apostrophes, _, bare, _ = _piece_kinds(tokenizer, vocab)
    best: tuple[float, int, int, bool] | None = None
    for i in range(len(own)):
        elided = i > 0 and bool(apostrophes[own[i - 1]])
        if not ((starts[own[i]] and not bare[own[i]]) or elided):
            continue
        end = i + 1
        while end < len(own) and not (starts[own[end]] and not bare[own[end]]):
            end += 1
        if tokenizer.decode([own[i:end]])[0].strip().replace("’", "'").casefold() in NOT_A_TERMS_WORD:
            continue
        weight = float(fall[i:end].sum())
        if best is None or weight > best[0]:
            best = (weight, i, end, elided)
    if best is None:
        return None
    _, i, end, elided = best
    begin = _word_start(own, i - 1, starts, bare) if elided else i
    return TermWord(begin, i, end, elided, tokenizer.decode([own[begin:end]])[0].strip())


def term_swaps(tokenizer, own: list[int], found: TermWord, terms: list[list[list[int]]], target: str,
               rules: DecodingRules) -> list[tuple[int, ...]]:
    """The model's own translation `own` (token ids) with its word for the first term (`found`: term_words') swapped for
    that term (`target`, its forms `terms[0]`), in each way the words before it may then be written; the caller keeps
    the one the model scores best. An article or preposition elided before the word ("l'argent", "d'argent": UNELIDED)
    stays elided before a term that takes elision ("l'automobile") and comes back whole before one that takes none, in
    each of its forms ("le fric", "la fric"); one that stands whole before the word ("la voiture", "ta voiture") is the
    caller's to write in each form it may take before the term (agreeing: "l'automobile", "ton automobile")."""
    begin, i, end, elided = found.begin, found.i, found.end, found.elided
    starts = {tok: tokenizer.begins_word(tok) for tok in set(own)}  # _piece_kinds' of own's tokens alone
    bare = {tok: bool(p) and not p.strip("'’") for tok in starts for p in [tokenizer.piece(tok)]}
    word, rest = found.text, tuple(own[end:])

    def ids(text: str) -> tuple[int, ...]:
        out = tokenizer.target_ids([text])[0]
        return tuple(out[:-1] if out[-1:] == [rules.end] else out)

    elides = len(terms[0]) > 1
    cut = next((k for k, c in enumerate(word[:-1]) if c in "'’"), -1)
    if cut > 0 and word[:cut].casefold() in UNELIDED:  # "l'argent", "d'argent": the elided word stays, or comes back whole
        short = word[:cut]
        if elides:
            return [tuple(own[:begin]) + ids(f"{short}{word[cut]}{target}") + rest]
        before = _word_start(own, begin - 1, starts, bare) if begin > 0 else 0
        previous = tokenizer.decode([own[before:begin]])[0].strip() if begin > 0 else ""
        swaps = []
        for full in UNELIDED[short.casefold()]:
            if (previous.casefold(), full) in CONTRACTED:  # "de l'argent": "du fric", not "de le fric"
                swaps.append(tuple(own[:before]) + ids(f"{_cased(CONTRACTED[previous.casefold(), full], previous)} {target}") + rest)
            else:
                swaps.append(tuple(own[:begin]) + ids(f"{_cased(full, short)} {target}") + rest)
        return swaps
    if elided and elides:  # after an elided word tk does not know ("s'"), the term glued to it
        return [tuple(own[:i]) + tuple(terms[0][1]) + rest]
    return [tuple(own[:begin]) + tuple(terms[0][0]) + rest]  # the caller offers the article before it in each form (agreeing)


def agreeing(tokenizer, tokens: list[int], terms: list[list[list[int]]], targets: list[str], end: int) -> list[list[int]]:
    """The ways of writing `tokens` (a translation) with the article or determiner right before a term (AGREEING:
    "cette", "le", "de la"; ELIDED: "de") in each form it may take before that term, one place changed in each, `tokens`
    itself first where each such word may stand before its term as written. The search writes the word before it knows
    the term follows ("cette lycée", "le emploi", "ta automobile"), a swap keeps the one the model's word took. Before a
    term beginning with a vowel only the forms written before one ("l'emploi", "cet", "ton"), before a consonant only
    the others, before an h or a y both ("l'hôtel", "le héros"); plural forms ("les", "aux") only before a term ending
    as French plurals do. The caller keeps whichever way the model scores best, so gender is the model's to know ("ce
    lycée", "ton automobile")."""
    tokens = list(tokens)
    starts = {tok: tokenizer.begins_word(tok) for tok in set(tokens)}  # _piece_kinds' of these tokens alone
    bare = {tok: bool(p) and not p.strip("'’") for tok in starts for p in [tokenizer.piece(tok)]}
    changed, stands, p = [], True, 1
    while p < len(tokens):
        hit = next(((forms, target) for forms, target in zip(terms, targets) if tokens[p:p + len(forms[0])] == forms[0]), None)
        if hit is None or not starts[tokens[p]]:
            p += 1
            continue
        forms, target = hit
        before = _word_start(tokens, p - 1, starts, bare)
        words = tokenizer.decode([tokens[before:p]])[0].strip()
        if before > 0:  # "de la", "à la": the article and the preposition before it
            first = _word_start(tokens, before - 1, starts, bare)
            two = f"{tokenizer.decode([tokens[first:before]])[0].strip()} {words}"
            if _agreeing_forms(two, target)[1]:
                before, words = first, two
        fits, others = _agreeing_forms(words, target)
        stands = stands and fits
        for form in others:
            space = "" if form.endswith(("'", "’")) else " "
            glued = tokenizer.target_ids([f"{_cased(form, words)}{space}{target}"])[0]
            changed.append(tokens[:before] + (glued[:-1] if glued[-1:] == [end] else glued) + tokens[p + len(forms[0]):])
        p += len(forms[0])
    return ([tokens] if stands else []) + changed


def _agreeing_forms(words: str, target: str) -> tuple[bool, list[str]]:
    """Whether the article or determiner `words` may stand before `target` as written, and the other forms of its kind
    that may (agreeing); (True, []) for words of no kind."""
    key = words.casefold()
    kinds = [kind for kind in AGREEING if key in kind[0] or key in kind[1]]
    if key in ELIDED:
        kinds.append(((key,), (ELIDED[key] + "'",)))
    if not kinds:
        return True, []
    first = target[:1].casefold()
    fitting = [f for consonant, vowel in kinds
               for f in (consonant + vowel if first in "hy" else vowel if first in ELIDES else consonant)
               if f not in PLURAL or target.casefold().endswith(("s", "x", "z"))]
    fits = key in fitting or key in PLURAL  # a plural the search wrote stays a way: the sentence may want the target plural
    return fits, [f for f in dict.fromkeys(fitting) if f != key]


# The articles and prepositions elided before a vowel or h (ELIDES) in French, Italian and Catalan, by their elided
# form, and the other way round: where a term swapped in changes whether they elide, the model's score picks the form
# (gender is the model's to know: "le fric", "la faute").
UNELIDED = {"l": ("le", "la", "lo", "el"), "d": ("de", "di"), "qu": ("que",), "un": ("una",), "dell": ("dello", "della"),
            "all": ("allo", "alla"), "nell": ("nello", "nella"), "sull": ("sullo", "sulla"), "dall": ("dallo", "dalla")}
ELIDED = {full: short for short, fulls in UNELIDED.items() for full in fulls}
ELISION_STUBS = frozenset(UNELIDED) - {"un"}  # the elided forms that are no word of their own ("un" is one)
CONTRACTED = {("de", "le"): "du", ("à", "le"): "au"}  # a preposition and the article after it, as French writes them
# French articles and determiners whose form follows the noun after them, each as (its forms before a consonant, before
# a vowel or mute h): agreeing offers the others of the kind the word before a term is of.
AGREEING = ((("le", "la", "les"), ("l'", "les")), (("un", "une"), ("un", "une")), (("ce", "cette", "ces"), ("cet", "cette", "ces")),
            (("mon", "ma", "mes"), ("mon", "mes")), (("ton", "ta", "tes"), ("ton", "tes")), (("son", "sa", "ses"), ("son", "ses")),
            (("du", "de la", "des"), ("de l'", "des")), (("au", "à la", "aux"), ("à l'", "aux")),
            (("quel", "quelle", "quels", "quelles"), ("quel", "quelle", "quels", "quelles")))
PLURAL = frozenset({"les", "ces", "mes", "tes", "ses", "des", "aux", "quels", "quelles"})
# The words term_words never takes for a term's own word: the articles, determiners and prepositions above, whole or
# elided ("l'", "d'").
NOT_A_TERMS_WORD = frozenset({f for kind in AGREEING for forms in kind for f in forms} | set(ELIDED) | PLURAL
                             | {f"{short}'" for short in UNELIDED})


def _cased(word: str, like: str) -> str:
    """`word` with a capital first letter where `like` has one."""
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def _word_start(own: list[int], j: int, starts, bare) -> int:
    """Where the word holding own[j] (an elided word's last piece) begins: an apostrophe alone ("'" after "▁l") begins
    none. starts, bare: _piece_kinds' arrays, or mappings of own's tokens alone."""
    if j > 0 and bare[own[j]]:
        j -= 1
    while j > 0 and not starts[own[j]]:
        j -= 1
    return j


def _read_each(backend: StepBackend, srcs: list[list[int]], owns: list[list[int]], rules: DecodingRules) -> tuple[list[np.ndarray], int]:
    """The log-probability of each token of owns[r] (its end token's last) as the model reads srcs[r], all rows read
    in one padded batch (one decoder run a token for all of them), and the model's output vocabulary."""
    state = backend.encode(*pad_batch(srcs, rules.pad))
    seqs = [[*own, rules.end] for own in owns]
    longest = max(map(len, seqs))
    table = np.array([seq + [rules.end] * (longest - len(seq)) for seq in seqs], dtype=np.int64)  # past its end: ignored
    token, read, vocab = np.full(len(seqs), rules.start, dtype=np.int64), np.zeros(table.shape), 0
    rows = np.arange(len(seqs))
    for i in range(longest):
        log_probs, state = backend.step(token, state)
        read[:, i], vocab = log_probs[rows, table[:, i]], log_probs.shape[1]
        token = table[:, i]
    return [read[r, :len(seq)] for r, seq in enumerate(seqs)], vocab


def scored_each(backend: StepBackend, items: list[tuple[list[int], list[int]]], rules: DecodingRules, rows: int = 64) -> list[Hypothesis]:
    """Each (src, tokens): `tokens` as a translation of `src`, its summed log-probability (the end token's included, as
    a search scores it), read in padded batches of up to `rows` (_read_each): a call's ways of writing its sentences'
    terms (elided, swapped) read together rather than one decoder run a token for each."""
    out: list[Hypothesis] = []
    for at in range(0, len(items), rows):
        chunk = items[at: at + rows]
        reads, _ = _read_each(backend, [src for src, _ in chunk], [list(tokens) for _, tokens in chunk], rules)
        out += [Hypothesis(list(tokens), float(read.sum())) for (_, tokens), read in zip(chunk, reads)]
    return out
