"""Parse one Kineto (PyTorch profiler) Chrome-trace file into the event table.

Bytes in (``.json`` or gzipped), :data:`pardiag.analyzer.trace.traceset.EVENT_COLUMNS` table out,
with the dialects seen in the field (FACTS §2):

* newest format: ``ts`` relative to ``baseTimeNanoseconds``, fractional µs;
* legacy format: categories ``Kernel``/``Operator``/``Runtime``/``Memcpy``/``Memset`` and ``tid``
  strings such as ``"stream 7"``; other accelerators' runtime categories (``xpu_runtime``, ...);
* bare ``inf``/``-inf``/``nan``/``NaN``/``Infinity`` tokens and raw control characters in strings;
* stray timestamps: events at ``ts`` 0 among epoch timestamps, or years away from the rest of
  the file, however many (left out, one warning per file that says how many and where:
  :func:`stray_timestamps`);
* kernels on one stream that overlap (the earlier one is clipped to end where the next starts:
  a stream runs one kernel at a time; counted in a note).

Strict-JSON files are decoded with msgspec into only the fields pardiag reads, a slice of
events at a time (:func:`parse_trace_fast`); anything else takes the tolerant orjson/json path
(:func:`read_trace_bytes` + :func:`events_frame`), which builds the same table. No file system
access except :func:`read_trace_json`; no analysis.
"""

from __future__ import annotations

import gzip
import json
import re
import types
import zlib
from collections.abc import Iterable
from pathlib import Path

import orjson
import pandas as pd

from pardiag.errors import TraceError

from . import vocab
from .columns import MISSING, frame_from_columns, keeps_args

# Bare non-JSON number tokens, outside strings (see _sanitize_json).
_BARE_NONFINITE_RE = re.compile(r'(-?)\b(inf|infinity|nan)\b', re.IGNORECASE)


def _sanitize_json(text: str) -> str:
    """Replace bare inf/nan tokens that are outside JSON strings with ``null``."""
    out: list[str] = []
    # Split on string literals; odd pieces are strings and are kept as they are.
    for i, piece in enumerate(re.split(r'("(?:[^"\\]|\\.)*")', text, flags=re.DOTALL)):
        out.append(piece if i % 2 else _BARE_NONFINITE_RE.sub("null", piece))
    return "".join(out)


def read_trace_bytes(raw: bytes, path: Path) -> tuple[dict, list[str]]:
    """Parse the bytes of one trace file (gzip or plain JSON).

    Like :func:`read_trace_json` but from bytes already read, and also returns what had to be
    repaired (one line each: invalid UTF-8 replaced, bare ``NaN``/``inf`` tokens read as null,
    raw control characters accepted, unpaired surrogate escapes kept, numbers beyond the float
    range read as infinity).

    Raises:
        TraceError: truncated or corrupt gzip, empty, not JSON, or not a JSON object.
    """
    return parse_json(plain_bytes(raw, path), path)


_inflater: types.ModuleType
try:  # Intel's ISA-L inflates gzip about twice as fast as zlib (same bytes out, CRC checked)
    from isal import igzip as _igzip
    from isal import isal_zlib as _inflater

    _gunzip_members = _igzip.decompress
    _GUNZIP_ERRORS: tuple = (_inflater.error,)
except ImportError:  # a platform without its wheel
    _inflater = zlib
    _gunzip_members = gzip.decompress
    _GUNZIP_ERRORS = ()


def _gunzip(raw: bytes) -> bytes:
    """The inflated bytes of a gzip file: a file of one member in one pass (the usual case),
    anything else (several members, zero padding, a truncated or corrupt file) by the gzip
    module's reading, which gives the bytes or the error.

    Raises:
        ValueError: bytes after the compressed data that are not another member (named as
            such: the gzip module's own error for them speaks of a truncated file); the gzip
            module's and ISA-L's errors.
    """
    inflater = _inflater.decompressobj(wbits=31)  # 31: a gzip header and trailer (CRC, size)
    try:
        out = inflater.decompress(raw)
    except (zlib.error, *_GUNZIP_ERRORS):
        return _gunzip_members(raw)
    rest = inflater.unused_data
    if inflater.eof and not rest:
        return out
    del out
    if inflater.eof and rest[:2] != b"\x1f\x8b" and rest.strip(b"\x00"):
        # bytes after the member that are neither another member nor zero padding
        raise ValueError(f"{len(rest)} bytes after the end of the compressed data are not "
                         f"another gzip member")
    return _gunzip_members(raw)


def plain_bytes(raw: bytes, path: Path) -> bytes:
    """The file's JSON bytes: gunzipped when gzip, without a UTF-8 byte-order mark.

    Raises:
        TraceError: truncated or corrupt gzip, or nothing but whitespace.
    """
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = _gunzip(raw)
        except (OSError, EOFError, ValueError, zlib.error, *_GUNZIP_ERRORS) as exc:
            raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    if raw[:3] == b"\xef\xbb\xbf":  # UTF-8 byte-order mark
        raw = raw[3:]
    if not raw or raw.isspace():  # (not raw.strip(), which copies the file)
        raise TraceError(f"{path}: empty file")
    return raw


#: What Python's ``json`` accepted where orjson refused, by the words of orjson's message.
_REPAIRS = (("control character", "raw control characters inside strings accepted"),
            ("surrogate", "unpaired UTF-16 surrogate escapes kept as they are"),
            ("infinity", "numbers beyond the float range read as infinity"))


def _repair_of(refusal: str) -> str:
    """The repair line for a document that only Python's ``json`` read: what orjson's first
    refusal (its message) names, else the message itself."""
    low = refusal.lower()
    for words, repair in _REPAIRS:
        if words in low:
            return repair
    return f"read by Python's json where orjson refused it ({refusal})"


#: Where a string ended early at an unescaped quote, Python's json stops with one of these.
_EARLY_END = ("Expecting ',' delimiter", "Expecting ':' delimiter",
              "Expecting property name enclosed in double quotes")
#: The real end of a string value: a quote followed by what follows a value in Kineto's output.
_VALUE_END = re.compile(r'"(?=[ \t]*(?:,[ \t\r\n]*["{\[\d-]|,[ \t]*\r?\n|[\r\n]*[ \t]*[}\]]))')
#: Distinct broken strings repaired at most (each costs one reading of the document).
MAX_QUOTE_REPAIRS = 200


def _string_before(text: str, pos: int) -> tuple[int, int] | None:
    """(opening, closing) index of the string that ends just before ``pos`` (whitespace
    between), or None."""
    close = pos - 1
    while close >= 0 and text[close] in " \t\r\n":
        close -= 1
    if close < 1 or text[close] != '"':
        return None
    i = close - 1
    while i >= 0:
        if text[i] == '"':
            slashes = 0
            while i - 1 - slashes >= 0 and text[i - 1 - slashes] == "\\":
                slashes += 1
            if slashes % 2 == 0:
                return i, close
        i -= 1
    return None


def _escape_stray_quotes(text: str) -> tuple[dict | list | None, str, list[str]]:
    """Read ``text`` where string values hold unescaped double quotes (Kineto writes a
    ``record_function`` name or a process-group description with a ``"`` in it as it is):
    where json stops because a string ended early, the string runs instead to the first quote
    that a value's end follows (:data:`_VALUE_END`), its inner quotes are escaped, and every
    occurrence of that broken string in the document is replaced at once.

    Returns:
        (the document or None where it still cannot be read, the text, the strings repaired).
    """
    fixed: list[str] = []
    while len(fixed) < MAX_QUOTE_REPAIRS:
        try:
            return json.loads(text, strict=False), text, fixed
        except json.JSONDecodeError as exc:
            if not exc.msg.startswith(_EARLY_END):
                return None, text, fixed
            span = _string_before(text, exc.pos)
            end = _VALUE_END.search(text, exc.pos) if span else None
            if span is None or end is None:
                return None, text, fixed
            literal = text[span[0]:end.start() + 1]
            inner = literal[1:-1]
            repaired = '"' + re.sub(r'(?<!\\)"', r'\\"', inner) + '"'
            if repaired == literal:
                return None, text, fixed
            text = text.replace(literal, repaired)
            fixed.append(inner)
        except RecursionError:
            return None, text, fixed
    return None, text, fixed


#: What the trace format calls a bare list of events; the lines of :func:`parse_json` that name
#: it say how the file was written, not what was repaired.
ARRAY_FORM = "the trace format's JSON Array form"


def parse_json(raw: bytes, path: Path) -> tuple[dict, list[str]]:
    """The tolerant reading of a file's JSON bytes: orjson, else (bare ``NaN``/``Infinity``,
    control characters in strings, unpaired surrogate escapes, numbers beyond the float range,
    invalid UTF-8) Python's ``json`` after repairs.

    Returns:
        (the document, the repairs made: one line each).

    Raises:
        TraceError: not valid JSON even after the repairs, or the top level is not an object.
    """
    repairs: list[str] = []
    if raw.lstrip()[:1] == b"[" and not raw.rstrip().endswith(b"]"):
        # the trace format's JSON Array form may leave its closing bracket out (a writer that
        # streams events and is stopped): the array, closed
        raw = raw.rstrip().rstrip(b",") + b"]"
        repairs.append(f"its closing bracket left out, as {ARRAY_FORM} allows: closed")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as refused:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            repairs.append("invalid UTF-8 bytes replaced by U+FFFD")
        clean = _sanitize_json(text)
        if clean != text:
            repairs.append("bare NaN/Infinity tokens read as null")
        try:
            doc = json.loads(clean, strict=False)
        except (json.JSONDecodeError, RecursionError) as exc:
            doc, _, quoted = (_escape_stray_quotes(clean) if isinstance(exc, json.JSONDecodeError)
                              else (None, clean, []))
            if doc is None:
                body = clean.rstrip()
                if (isinstance(exc, json.JSONDecodeError) and not body.endswith(("}", "]"))
                        and (exc.pos >= len(body) or exc.msg.startswith("Unterminated string"))):
                    # a copy or a write cut short: say so rather than quote the parser
                    raise TraceError(f"{path}: truncated (the file ends inside its JSON, "
                                     f"at line {body.count(chr(10)) + 1}: it was cut short "
                                     "while written or copied)") from None
                raise TraceError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}"
                                 f" column {exc.colno})" if isinstance(exc, json.JSONDecodeError)
                                 else f"{path}: not valid JSON (nested too deeply)") from None
            example = quoted[0] if len(quoted[0]) <= 80 else quoted[0][:77] + "..."
            repairs.append(f"unescaped double quotes inside {len(quoted)} distinct string(s) "
                           f"escaped (a name written as it is, such as {example!r})")
        if not repairs:
            repairs.append(_repair_of(refused.msg))
    if isinstance(doc, list) and doc and all(isinstance(e, dict) for e in doc[:100]):
        # the trace format's JSON Array form (a bare list of events, as some merge tools
        # write): its events, and no metadata
        repairs.append(f"a bare array of events ({ARRAY_FORM}): read as its traceEvents, "
                       f"without the metadata an object carries (distributedInfo, "
                       f"baseTimeNanoseconds)")
        doc = {"traceEvents": doc}
    if isinstance(doc, list):
        raise TraceError(f"{path}: not a Kineto trace (its top level is an array "
                         + ("with nothing in it" if not doc else "whose entries are not all "
                            "events (JSON objects)") + ")")
    if not isinstance(doc, dict):
        raise TraceError(f"{path}: not a Kineto trace (top level is not a JSON object)")
    return doc, repairs


def read_trace_json(path: Path) -> dict:
    """Read one trace file (``.json`` or ``.json.gz``) into a dict.

    Tries orjson first; on failure retries with bare ``inf``/``nan`` tokens replaced by ``null``,
    raw control characters allowed inside strings and invalid UTF-8 replaced.

    Raises:
        TraceError: the file is unreadable, truncated, not JSON, or not a JSON object.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return read_trace_bytes(raw, path)[0]


def is_trace_doc(doc: dict) -> bool:
    """Whether a decoded document is a trace: it has a ``traceEvents`` list."""
    return isinstance(doc.get("traceEvents"), list)


def events_frame(raw_events: Iterable, path: Path, display_time_unit: str | None = None
                 ) -> tuple[pd.DataFrame, dict, list[str], list[str]]:
    """Turn raw trace events into the :data:`EVENT_COLUMNS` table.

    Keeps complete events (``ph`` ``X``) and ``[memory]`` instant events; reads thread names.
    ``ts``/``dur`` are µs (Chrome trace format; ``displayTimeUnit`` only sets the display unit),
    except that a file with ``displayTimeUnit: "ns"`` whose timestamps are epoch nanoseconds is
    converted to µs with a warning.

    Args:
        raw_events: the ``traceEvents`` list (dicts; other entries are counted and left out).
        path: the file, for messages.
        display_time_unit: the file's ``displayTimeUnit``.

    Returns:
        (events, thread_names, warnings, notes). Events with a non-finite, negative or
        implausible (> :data:`MAX_PLAUSIBLE_US`) ``ts``/``dur`` and events with stray
        timestamps (``ts`` 0 among epoch times, years away from the rest:
        :func:`stray_timestamps`) are dropped and counted in warnings; numbers written as
        strings are read and counted in a warning.
    """
    raw_events = raw_events if isinstance(raw_events, list) else list(raw_events)
    objs = [e for e in raw_events if type(e) is dict]
    not_objects = len(raw_events) - len(objs)
    thread_names: dict = {}
    for e in objs:
        if (e.get("ph") == "M" and vocab.metadata_name(e.get("name"))[0] == "thread_name"
                and isinstance(e.get("args"), dict)):
            thread_names[(str(e.get("pid")), str(e.get("tid")))] = str(
                vocab.THREAD_NAME.get(e["args"], ""))
    keep = [e for e in objs
            if (ph := e.get("ph")) == "X" or (ph == "i" and e.get("name") == "[memory]")]
    phs = [e["ph"] for e in keep]
    argss = [a if type(a := e.get("args")) is dict else {} for e in keep]
    names_raw = [e.get("name") for e in keep]
    return frame_from_columns(
        path, display_time_unit, thread_names, not_objects,
        names_raw=names_raw, cats_raw=[e.get("cat") for e in keep], phs=phs,
        pids_raw=[e.get("pid", "") for e in keep], tid_raw=[e.get("tid", "") for e in keep],
        ts_raw=[e.get("ts") for e in keep],
        dur_raw=[e.get("dur") if ph == "X" else 0.0 for e, ph in zip(keep, phs)],
        no_dur=sum(1 for e, ph in zip(keep, phs) if ph == "X" and "dur" not in e),
        arg_stream=[vocab.STREAM.get(a, MISSING) for a in argss],
        arg_queue=[vocab.SYCL_QUEUE.get(a, MISSING) for a in argss],
        arg_corr=[vocab.CORRELATION.get(a, -1) for a in argss],
        arg_device=[vocab.DEVICE.get(a, MISSING) for a in argss],
        kept_args=[a if (a and k) else None for a, k in zip(argss, keeps_args(names_raw))])


#: Metadata events that name a process (``pardiag merge`` and other tools name each rank's
#: processes ``rank N``).
PROCESS_META = frozenset({"process_name", "process_labels"})
#: Key under which the parser leaves ``{pid: [process names and labels]}`` in a file's metadata
#: (read by :func:`_split_merged`, removed before the metadata is kept).
PROCESS_NAMES_KEY = "_pardiag_process_names"


def read_process_names(objs: list) -> dict[str, list[str]]:
    """``{pid: [process_name / process_labels values]}`` of raw trace events (``rank N`` too
    for a process whose metadata a merge tool prefixed with its rank,
    :func:`pardiag.analyzer.trace.vocab.metadata_name`)."""
    out: dict[str, list[str]] = {}
    for e in objs:
        if type(e) is not dict or e.get("ph") != "M":
            continue
        name, rank = vocab.metadata_name(e.get("name"))
        if rank is not None and f"rank {rank}" not in out.get(str(e.get("pid")), []):
            out.setdefault(str(e.get("pid")), []).append(f"rank {rank}")
        if type(name) is str and name in PROCESS_META and isinstance(e.get("args"), dict):
            a = e["args"]
            out.setdefault(str(e.get("pid")), []).append(
                str(vocab.THREAD_NAME.get(a, vocab.PROCESS_LABELS.get(a, ""))))
    return out




