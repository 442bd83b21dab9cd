"""Translating whole files with their structure kept: plain text, HTML, Word documents (.docx) and subtitles (.srt).

`read_file(path)` checks a file and cuts it into a Document: the texts it needs translated (each once, in order, with
where each comes from) and how to write it back; `Document.render(translations)` gives the translated file's bytes and
`Document.save(path, translations)` writes them. `translate_file` does all three around one translate callable (texts in,
their translations out, in order), which is how `tk translate -i FILE` and tk serve's /translate_file use it.

What each kind keeps:
- .txt: every line, its line ending and its indentation; each non-blank line is one text (the line translation splits it
  into sentences).
- .html/.htm: the whole document through toolkit.deploy.markup (markup kept byte for byte, only text translated).
- .docx (python-docx): every paragraph of the body, its tables (nested ones too), text boxes, headers, footers, footnotes
  and endnotes. A paragraph's runs are written as inline elements of an HTML fragment for markup.plan/render, so a bold or
  italic run stays on the words it is the translation of; a hyperlink keeps its link, a field its code, and anything
  that is not text (a tab, a break, a picture, a field's instruction) stays where it was, the text on each side of it
  translated apart.
- .srt (the srt library): each subtitle's text; its index, timing and every byte around the text stay as they were. A
  subtitle of several lines is translated as one sentence and cut back into as many lines, of shares like the original's;
  one whose lines each start with a dash (a dialogue) is translated line by line.

Files are untrusted input, refused with a one-line UsageError before any heavy work: one over its size limit (Limits); a
.docx whose zip directory, read before anything is unpacked, declares too many entries, too many bytes unpacked, or an
entry that unpacks to over Limits.ratio times its packed size (a zip bomb); one with a DTD in any XML part (entity
expansion: a .docx never has one, and no parser here resolves entities or reads the network); one with an external
relationship other than a hyperlink (an attached template or linked picture that Word would fetch on opening the
translation; a hyperlink's address is only kept, never fetched). A file that cannot be read is a DataError naming the file
and the place (the part and line of a .docx, the line of an .srt, the byte of invalid UTF-8). Output is written
atomically (core.atomic), never over the input. Torch-free; python-docx and srt are imported only for their kinds.

The package's modules, one per concern: kinds (which files, by extension), safety (size limits and the checks of a
.docx before it is unpacked), document (the Document), text, html, srt and docx (one reader per kind; text holds the
decoding they share), reading (read_file) and translating (translate_file and the output check).
"""

from toolkit.deploy.files.document import Document
from toolkit.deploy.files.kinds import KINDS, MEDIA_TYPES, SUPPORTED, kind_of
from toolkit.deploy.files.reading import read_file
from toolkit.deploy.files.safety import Limits, MiB
from toolkit.deploy.files.translating import check_destination, translate_all, translate_file

__all__ = ["KINDS", "MEDIA_TYPES", "SUPPORTED", "Document", "Limits", "MiB", "check_destination", "kind_of", "read_file", "translate_all",
           "translate_file"]
