"""format html on odd, broken and malicious fragments: every byte of markup comes back as it was written, only text is translated,
and cutting a fragment takes time linear in its size.

The byte-for-byte checks use an identity translator, under which the whole fragment must come back unchanged; the
linearity checks count the Python lines executed (sys.settrace) at n and 4n, so they hold on any machine's speed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.deploy import markup


def identity(texts: list[str]) -> list[str]:
    return list(texts)


def upper(texts: list[str]) -> list[str]:
    return [t.upper() for t in texts]


def round_trip(fragment: str, translate=identity) -> str:
    return markup.translate_html([fragment], translate)[0]


def markup_of(fragment: str) -> list:
    """What translating must not change, as tk cuts the fragment: the markup and untranslated content between blocks, in
    order, and each block's tags (a block's inline elements follow their words, so their order inside it may change, and
    so may the white space around its words)."""
    return [part if isinstance(part, str) else sorted(item.raw for item in part.items if isinstance(item, markup._Tag))
            for part in markup.plan(fragment).parts if not isinstance(part, str) or part.strip()]


HOSTILE = [
    "<p>Hello.</p><script>I am home.",  # an unclosed script: the rest is script, as a browser reads it
    "<p>Hello.</p><style>p { color: red } I am home.",
    "<p>Hello.</p><!-- I am home.",  # an unterminated comment runs to the end
    "<p>Hello.</p><!-- I am home. --!> Goodbye.",
    "<!--->I am home.<!-->Goodbye.<!---->",
    "<![CDATA[I am home.]]>",
    "<svg><![CDATA[x > y]]></svg><p>Hello.</p>",
    "<![CDATA[I am home.",
    '<!DOCTYPE html [ <!ENTITY home "I am home."> ]><p>Hello.</p>',
    "<!DOCTYPE html><p>Hello.</p>",
    "<?xml version='1.0'?><p>Hello.</p><?php echo 1",
    "<P CLASS=x>Hello.</P >",
    "<p>Hello.</p foo='>' >",
    "<a href='x>y' title=\"a > b\">I am home.</a>",
    '<b class="x>Hello.',  # an unterminated tag at the end
    "<p>Hello <b>world",
    "<p>a < b and c > d, I am home.</p>",
    "Tom &amp; Jerry &eacute;t&eacute; &nbsp;&#39;&#x41; &amp &lt &copy;2024 &bogus;",
    "<code>&#60;tag&#62; a &lt; b</code>",
    "<pre>  keep\n  this  </pre>",
    "</>I am home.</ p><//x>",
    "<title>I am <b>home</b>.</title>",
    "<textarea>I am <b>home</b>.</textarea>Hello.",
    "<script/>I am home.",
    "<style>p{}</STYLE >Hello.<SCRIPT>if (a</b) x()</script  >",
    "<plaintext><b>I am home.</b>",
    "<p>Hello.</p></script></div></p></b>",
    "<div>\r\n Hello. \r\n</div>\t",
    "<p>\x00I am\x0c home.</p>",
    "<", "<<<>>>", "&", "", "   ", "<p>", "</p>", "<!", "<!-", "<!--", "</", "<a", "<a b", "<a b=", "<a b='", "<?",
    "<p translate=no>I am <b>home</b>.</p><p class='notranslate x'>Hello.</p>",
    "<p>I'm <b>home</b>. <a name=top></a><i>Hello</i> <b><i>nested</i></b></p>",
    "<ul>\n  <li>One <em>big</em> dog.</li>\n  <li>Two <a href='#'>small</a> cats.</li>\n</ul>",
]


@pytest.mark.parametrize("fragment", HOSTILE)
def test_an_identity_translation_gives_the_fragment_back_byte_for_byte(fragment):
    assert round_trip(fragment) == fragment
    assert markup_of(round_trip(fragment, upper)) == markup_of(fragment)


def test_what_a_browser_reads_as_script_or_comment_is_kept_and_not_translated():
    assert round_trip("<p>Hello.</p><script>I am home.", upper) == "<p>HELLO.</p><script>I am home."
    assert round_trip("<p>Hello.</p><!-- I am home.", upper) == "<p>HELLO.</p><!-- I am home."
    assert round_trip("<![CDATA[I am home.]]>Hello.", upper) == "<![CDATA[I am home.]]>HELLO."
    assert round_trip('<!DOCTYPE x [ <!ENTITY h "I am home."> ]><p>Hello.</p>', upper) == '<!DOCTYPE x [ <!ENTITY h "I am home."> ]><p>HELLO.</p>'
    assert round_trip("<P>Hello.</P >", upper) == "<P>HELLO.</P >"
    assert round_trip("<textarea/>I am home.</textarea>Hello.", upper) == "<textarea/>I am home.</textarea>HELLO."
    assert round_trip("<title>I &amp; you</title>", upper) == "<title>I &amp; YOU</title>"
    assert round_trip('<b class="x>Hello.', upper) == '<b class="x>Hello.'  # an unterminated tag is markup, not text
    # Translated text is escaped as HTML text; text the translator left as it was keeps its own spelling.
    assert round_trip("<p>a < b, I am home.</p>", upper) == "<p>A &lt; B, I AM HOME.</p>"
    assert round_trip("<p>&eacute;t&eacute; &#39;24</p><p>&#39;24 &amp;</p>", upper) == "<p>ÉTÉ '24</p><p>&#39;24 &amp;</p>"


PIECES = ["<", ">", "/", "</", "<!--", "-->", "--!>", "<!", "<?", "<![CDATA[", "]]>", "]>", "[", "<!DOCTYPE x", "<script>", "</script>",
          "<style>", "</style ", "<title>", "</title>", "<textarea>", "<plaintext>", "<p>", "</p>", "<P>", "<b>", "</b>", "<i>",
          "</i>", "<a href=", "<code>", "</code>", "<br/>", " translate=no", " class=notranslate", '"', "'", "=", " ", "\n", "\r",
          "&", "&amp;", "&lt", "&#", "&#x41;", "&eacute;", "Hello", "I am home.", "a", "ß", "İ", "42", ".", "\x00"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
def test_any_mix_of_markup_pieces_comes_back_byte_for_byte(fragment):
    assert round_trip(fragment) == fragment
    assert markup_of(round_trip(fragment, upper)) == markup_of(fragment)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("<>/!?-[]=\"' \nabpi&;#x0"), max_size=60))
def test_any_string_of_html_characters_comes_back_byte_for_byte(fragment):
    assert round_trip(fragment) == fragment


def lines_run(work) -> int:
    """How many lines of Python `work()` executes: a measure of its work that does not depend on the machine's speed."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(previous)
    return count


def growth(fragment, n: int, translate=upper) -> float:
    """How much more work translating fragment(4n) takes than fragment(n): about 4 when linear, 16 when quadratic."""
    small = lines_run(lambda: round_trip(fragment(n), translate))
    large = lines_run(lambda: round_trip(fragment(4 * n), translate))
    return large / small


def test_deep_nesting_with_stray_end_tags_is_cut_in_linear_time():
    assert growth(lambda n: "<div>" * n + "Hello." + "</p>" * n, 300) < 6
    assert growth(lambda n: "<div>" * n + "Hello." + "</div>" * n, 300) < 6
    assert growth(lambda n: "<p>" + "<b>" * n + "Hello." + "</i>" * n + "</b>" * n, 300) < 6


def test_many_inline_elements_are_placed_in_linear_time():
    assert growth(lambda n: "<p>" + "<b>home</b> " * n + "</p>", 40) < 6
    assert growth(lambda n: "<p>" + " ".join(f"<a href=#{k}>word{k}</a>" for k in range(n)) + "</p>", 40) < 6
    # Elements the translation does not keep in their order: each placed still, each found once.
    reordered = lambda texts: [" ".join(reversed(t.split())) for t in texts]  # noqa: E731
    assert growth(lambda n: "<p>" + " ".join(f"<b>w{k}</b>" for k in range(n)) + "</p>", 40, reordered) < 6


def test_a_long_line_of_nested_tags_is_translated_whole_by_tk_translate(cli):
    n = 4000
    fragment = "<div>" * n + "Hello." + "</p>" * n
    shipped = Path(__file__).resolve().parents[2] / "exported" / "transformer"
    from toolkit.deploy.api import Translator

    hello = Translator(shipped, provider="cpu", variant="fp32").translate(["Hello."])[0]
    r = cli("translate", "-q", "--model", shipped, "--variant", "fp32", "--provider", "cpu", "--format", "html", fragment,
            "<p>Hello.</p><script>I am home.")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["<div>" * n + hello + "</p>" * n, f"<p>{hello}</p><script>I am home."]


def test_the_api_keeps_what_follows_an_unclosed_script():
    from toolkit.deploy.api import Translator

    shipped = Path(__file__).resolve().parents[2] / "exported" / "transformer"
    t = Translator(shipped, provider="cpu", variant="fp32")
    hello = t.translate(["Hello."])[0]
    assert t.translate(["<p>Hello.</p><script>I am home.", "<p>Hello.</p><!-- I am home."], format="html") == [
        f"<p>{hello}</p><script>I am home.", f"<p>{hello}</p><!-- I am home."]
