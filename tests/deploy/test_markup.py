"""Issue 50, format html (toolkit.deploy.markup): the text of an HTML fragment is translated and its markup stays in place.
Checked with stand-in translators whose output follows from their input (upper case, reversed words), so every expected
fragment holds by construction; then the real paths (the API, tk translate --format html) against each other."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from toolkit.deploy import markup


def upper(texts: list[str]) -> list[str]:
    return [t.upper() for t in texts]


def reversed_words(texts: list[str]) -> list[str]:
    return [" ".join(reversed(t.split())) for t in texts]


def skeleton(fragment: str) -> list[tuple]:
    """The fragment's tags with their attributes, in order: what translating must not change."""
    tags: list[tuple] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append(("start", tag, tuple(attrs)))

        def handle_endtag(self, tag):
            tags.append(("end", tag))

        def handle_startendtag(self, tag, attrs):
            tags.append(("empty", tag, tuple(attrs)))

        def handle_comment(self, data):
            tags.append(("comment", data))

    parser = Tags()
    parser.feed(fragment)
    parser.close()
    return tags


def test_inline_elements_stay_around_their_own_words():
    calls: list[list[str]] = []

    def translate(texts: list[str]) -> list[str]:
        calls.append(texts)
        return upper(texts)

    assert markup.translate_html(["<p>I'm <b>home</b>.</p>"], translate) == ["<p>I'M <b>HOME</b>.</p>"]
    assert len(calls) == 1 and "I'm home." in calls[0]  # the sentence is translated whole, in one call
    # Words in another order: the element follows its words.
    fragment = '<p>the <a href="/x?a=1&amp;b=2" title="Keep">red cat</a> sleeps</p>'
    assert markup.translate_html([fragment], reversed_words) == ['<p>sleeps <a href="/x?a=1&amp;b=2" title="Keep">cat red</a> the</p>']


def test_an_element_whose_translation_alone_repeats_itself_goes_around_its_words_in_the_sentence():
    """A word translated alone can come out repeated (the shipped model: "world" -> "le monde monde monde le monde"):
    the element is put around the same words in the sentence's translation, not given the repeats."""
    table = {"Hello world.": "Salut le monde.", "Hello": "Salut", "world": "le monde monde monde le monde",
             "I like my red car.": "J'aime ma voiture rouge.", "red": "Rouge rouge rouge", "I like my": "J'aime mon", "car.": "voiture."}
    out = markup.translate_html(["<p>Hello <b>world</b>.</p>", "<p>I like my <i>red</i> car.</p>"], lambda texts: [table[t] for t in texts])
    assert out == ["<p>Salut <b>le monde</b>.</p>", "<p>J'aime ma voiture <i>rouge</i>.</p>"]
    # Words of the sentence that are not all the element's, or not every one of them, are no match: text node by text node.
    table.update({"world": "le monde entier", "red": "rouge vif"})
    out = markup.translate_html(["<p>Hello <b>world</b>.</p>", "<p>I like my <i>red</i> car.</p>"], lambda texts: [table[t] for t in texts])
    assert out == ["<p>Salut <b>le monde entier</b>.</p>", "<p>J'aime mon <i>rouge vif</i> voiture.</p>"]


def test_a_block_whose_element_is_not_found_is_translated_run_by_run():
    table = {"I'm home.": "Je suis chez moi.", "I'm": "Je suis", "home": "à la maison"}
    out = markup.translate_html(["<p>I'm <b>home</b>.</p>"], lambda texts: [table[t] for t in texts])[0]
    # "à la maison" is not in "Je suis chez moi.": each text node alone, "." (no words) kept, tags where they were.
    assert out == "<p>Je suis <b>à la maison</b>.</p>"


def test_code_script_style_and_translate_no_are_not_translated_and_entities_are_escaped_again():
    fragment = ("<div>Tom &amp; Jerry &lt;3 &eacute;t&eacute;<br>next line<script>if (a < b) x = '<b>y</b>';</script>"
                "<style>p > b { color: red }</style><code>ls -l &lt;dir&gt;</code><pre>keep  this</pre>"
                "<span translate=\"no\">Brand</span> <i class=\"x notranslate\">Name</i><!-- note --></div>")
    out = markup.translate_html([fragment], upper)[0]
    assert skeleton(out) == skeleton(fragment)
    assert "TOM &amp; JERRY &lt;3 ÉTÉ<br>NEXT LINE" in out
    assert "<script>if (a < b) x = '<b>y</b>';</script>" in out and "<style>p > b { color: red }</style>" in out
    assert "<code>ls -l &lt;dir&gt;</code>" in out and "<pre>keep  this</pre>" in out
    assert '<span translate="no">Brand</span>' in out and '<i class="x notranslate">Name</i>' in out and "<!-- note -->" in out


@pytest.mark.parametrize("fragment", [
    "<ul>\n  <li>One <em>big</em> dog.</li>\n  <li>Two <a href='#'>small</a> cats.</li>\n</ul>",
    "<p>a <b>very <i>good</i> day</b> indeed</p>",  # nested inline elements: run by run
    "<p>open <b>bold</p> after",  # an element the fragment leaves open
    "plain text, no tags",
    "<table><tr><td>Cell <u>one</u></td><td>42</td></tr></table><img src=x alt='A picture'>",
])
def test_the_markup_comes_back_unchanged(fragment):
    for translate in (upper, reversed_words):
        assert skeleton(markup.translate_html([fragment], translate)[0]) == skeleton(fragment)


def test_white_space_around_text_is_kept():
    out = markup.translate_html(["<p>\n  Hello   there\n</p>  <p> <b>x</b> y </p>"], upper)[0]
    assert out == "<p>\n  HELLO THERE\n</p>  <p> <b>X</b> Y </p>"


SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"


@pytest.fixture(scope="module")
def translator():
    from toolkit.deploy.api import Translator

    return Translator(SHIPPED, provider="cpu", variant="fp32")


def test_the_api_and_tk_translate_give_the_same_html(translator, cli):
    fragments = ["<p>I'm <b>home</b>.</p>", '<p>Where is <a href="/s">the station</a>? <code>x</code></p>', "I gave up."]
    via_api = translator.translate(fragments, format="html")
    assert via_api == markup.translate_html(fragments, translator.translate)
    for got, fragment in zip(via_api, fragments):
        assert skeleton(got) == skeleton(fragment)
    r = cli("translate", "-q", "--model", SHIPPED, "--variant", "fp32", "--provider", "cpu", "--format", "html", *fragments)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == via_api


def test_format_is_checked(translator, cli):
    from toolkit.core.errors import UsageError

    with pytest.raises(UsageError, match="format must be"):
        translator.translate(["Hi."], format="markdown")
    r = cli("translate", "--model", SHIPPED, "--format", "html", "--beam", 2, "--n-best", 2, "Hi.")
    assert r.exit_code == 2 and "--n-best" in r.output and "--format html" in r.output
