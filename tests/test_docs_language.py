"""The package, the tools and the documentation speak to users: what a thing does and why, never how its making was
organised. A user cannot resolve "issue 41", "the GPU lease", "what the next session needs" or "the hostile round":
they name nothing the user has. References to other projects' trackers ("transformers #123", "uvicorn issue #157",
"microsoft/onnxruntime#26717", a URL) are fine: anyone can open them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("toolkit", "tools", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".txt", ".html", ".js", ".mjs", ".sh", ".json", ".toml", ".tsv", ".log"}

# A tracker reference: "issue 41", "issues 41 and 51", "issue-41" (a heading's anchor), "#47".
TRACKER = re.compile(r"(?:\bissues?[\s-]+#?\d+|(?<![\w&/])#\d{2,}\b)(?![0-9a-fA-F])", re.I)
# Words that say how the work was organised, whatever precedes them.
ORGANISATION = re.compile(
    r"\blease[sd]?\b|\bleasing\b|hostile round|\btickets?\b|\bdevice (?:tool|calls?)\b|\blent (?:GPU|machine)s?\b|\bGPU is lent\b"
    r"|\b(?:next|this|previous|earlier|later|last|another) session(?:'s)?\b(?! run)|\bstart of (?:every|each|a|the) session\b"
    r"|\bthe issue(?:'s)?\b|\bissue targets?\b", re.I)
# What may stand right before an upstream tracker reference: a project (`transformers`, `pytest-xdist`, `CTranslate2`)
# or an owner/repository; not an English word that makes "issue 41" this project's own.
PROJECT_BEFORE = re.compile(r"(?:^|[\s(])([\w-]+(?:[./][\w-]+)*)\s+$")
CSS_COLOUR = re.compile(r"#(?:[0-9a-fA-F]{3}){1,2}\s*[;}\"',)]")
NOT_A_PROJECT = {"a", "an", "the", "see", "in", "of", "and", "or", "by", "per", "for", "as", "from", "at", "to", "with", "on", "our",
                 "this", "that", "its", "closes", "fixes", "fix", "after", "before", "issue", "issues", "s", "is", "was", "what", "which"}


def scanned_files() -> list[Path]:
    """The files a clone has under SCANNED (tracked, or new and not ignored: no node_modules, no caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *SCANNED], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [REPO / rel for rel in listed if rel and Path(rel).suffix in TEXT_SUFFIXES and (REPO / rel).is_file()]


def upstream(text: str, start: int) -> bool:
    """Whether the tracker reference at `start` is another project's (a URL, `owner/repo#N`, or a project's name right
    before it, on the line before too), or no tracker reference at all (a CSS colour)."""
    before, reference = text[max(0, start - 300):start], text[start:start + 20]
    if re.search(r"https?://\S*$", before) or CSS_COLOUR.match(reference):
        return True
    if reference.startswith("#") and before and not before[-1].isspace():
        return bool(re.search(r"[\w.-]+/[\w.-]+$", before))  # owner/repo#N; "(#47)" is ours
    named = PROJECT_BEFORE.search(before)
    return bool(named) and named.group(1).lower() not in NOT_A_PROJECT and not named.group(1).isdigit()


def findings(text: str) -> list[tuple[int, str]]:
    """(line number, the words) of every mention of how the work was organised in `text`."""
    found = [(match.start(), match.group(0)) for match in TRACKER.finditer(text) if not upstream(text, match.start())]
    found += [(match.start(), match.group(0)) for match in ORGANISATION.finditer(text)]
    return sorted((text.count("\n", 0, start) + 1, words.replace("\n", " ")) for start, words in found)


def test_the_check_tells_our_own_tracker_and_workflow_words_from_upstream_references():
    ours = ["Names copied verbatim (issue 41): how many", "issues 41 and 51", "(#47)", "[recipe](models.md#the-student-recipe-issue-41)",
            "the GPU lease: two device calls", "what the next session needs", "found in the hostile round", "one GPU lease",
            "At the start of every session check", "the lent GPU machines had CUDA 13 only", "Issue 41's test set",
            "the issue asks 97% greedy", "every issue target met"]
    theirs = ["uvicorn issue #157 proposes this very pair", "transformers #123", "CTranslate2 #1074 reports", "pytest-xdist #1378",
              "microsoft/onnxruntime#26717", "an open request, OpenNMT/CTranslate2#1933", "https://github.com/a/b/issues/12",
              "color: #222;", "each session's spinning workers", "every session of the process", "a release, please",
              "ONNX Runtime sessions", "#4477aa"]
    assert [text for text in ours if not findings(text)] == []
    assert [(text, findings(text)) for text in theirs if findings(text)] == []


def test_package_tools_and_docs_never_speak_of_how_the_work_was_organised():
    hits = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(REPO)
        hits += [f"{rel}:{number}: {words!r}" for number, words in findings(text)]
        if ORGANISATION.search(rel.name) or TRACKER.search(rel.name):
            hits.append(f"{rel}: its name")
    assert hits == [], "say what the thing is for a user instead of:\n" + "\n".join(hits)
