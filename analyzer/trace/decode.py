"""The fast way to read a strict-JSON Kineto file: msgspec decodes only the fields pardiag reads,
a slice of events at a time (:func:`parse_trace_fast`), into the same event table as the
tolerant path (:func:`pardiag.analyzer.trace.parse.events_frame`)."""

from __future__ import annotations

import functools
import itertools
import operator
from pathlib import Path

import msgspec
import numpy as np

from . import vocab
from .columns import MISSING, frame_from_parts, keeps_args, slice_arrays
from .parse import PROCESS_META, PROCESS_NAMES_KEY

#: The ``args`` of a decoded event that has none (this very object: told apart by identity from
#: an empty args object).
_NO_ARGS = msgspec.Raw(b"{}")


class _Fields(msgspec.Struct, gc=False):
    """The fields of a trace event that pardiag reads besides ``ph``; ``args`` stays undecoded
    JSON."""

    name: object = None
    cat: object = None
    pid: object = msgspec.UNSET
    tid: object = msgspec.UNSET
    ts: object = None
    dur: object = msgspec.UNSET
    args: msgspec.Raw = _NO_ARGS


class _Event(_Fields):
    """A trace event with its ``ph`` as a field (any value, or none: :data:`_EVENTS_DECODER`)."""

    ph: object = None


class _Complete(_Fields, tag_field="ph", tag="X"):
    """A complete event (``ph`` ``"X"``), decoded by its tag (see :data:`_TAGGED_DECODER`)."""


class _Instant(_Complete, tag="i"):
    """An instant event (``ph`` ``"i"``: ``[memory]`` among them)."""


class _Meta(_Complete, tag="M"):
    """A metadata event (``ph`` ``"M"``: thread and process names)."""


class _LiteArgs(msgspec.Struct, gc=False, frozen=True):
    """The args every row of the event table reads (its other args are kept only for
    communication and memory events); frozen, so that one instance, :data:`_NO_LITE`, stands for
    absent args."""

    stream: object = msgspec.field(default=msgspec.UNSET, name=vocab.STREAM.name)
    correlation: object = msgspec.field(default=-1, name=vocab.CORRELATION.name)
    sycl_queue: object = msgspec.field(default=msgspec.UNSET, name=vocab.SYCL_QUEUE.name)
    device: object = msgspec.field(default=msgspec.UNSET, name=vocab.DEVICE.name)


_NO_LITE = _LiteArgs()


class _LiteFields(_Fields):
    """:class:`_Fields` with ``args`` decoded into the three args every row reads (None where
    the args are ``null``; an args value of another kind fails the decode)."""

    # a subclass decodes the field into another type (msgspec allows it; mypy reads it as an
    # incompatible override)
    args: _LiteArgs | None = _NO_LITE  # type: ignore[assignment]


class _LiteComplete(_LiteFields, tag_field="ph", tag="X"):
    """A complete event decoded by :data:`_LITE_DECODER`."""


class _LiteInstant(_LiteComplete, tag="i"):
    """An instant event decoded by :data:`_LITE_DECODER`."""


class _ArgsOnly(msgspec.Struct, gc=False):
    """An event's args decoded whole (communication and memory events: :func:`keeps_args`)."""

    args: object = None


#: The other ``ph`` values of the Chrome trace format: such events are decoded to an empty
#: struct (flow events are a third of a GPU trace's events, and none is read).
_SKIPPED_PHS = ("B", "E", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "V", "v",
                "R", "c", "(", ")")


_SKIPPED_TYPES = tuple(msgspec.defstruct(f"_Skipped{i}", [], tag_field="ph", tag=ph, gc=False)
                       for i, ph in enumerate(_SKIPPED_PHS))


_SKIPPED = functools.reduce(operator.or_, _SKIPPED_TYPES)


#: The kind of each struct the tagged decoders build: 1 complete, 2 instant, 3 metadata, 0 an
#: event no table reads (:func:`_split_tagged`).
_TYPE_CODES: dict[type, int] = {_Complete: 1, _LiteComplete: 1, _Instant: 2, _LiteInstant: 2,
                                _Meta: 3, **dict.fromkeys(_SKIPPED_TYPES, 0)}


_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])


class _TopEvents(msgspec.Struct):
    """A trace document's event list, each event undecoded (the other keys are skipped)."""

    traceEvents: list[msgspec.Raw]


_TOP_EVENTS_DECODER = msgspec.json.Decoder(_TopEvents)


_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])


_LITE_LIST_DECODER = msgspec.json.Decoder(list[_LiteArgs])


_ARGS_LIST_DECODER = msgspec.json.Decoder(list[_ArgsOnly])


#: Events decoded by their ``ph`` with the args every row reads: only the fields of the kinds
#: pardiag reads are built. Events that fail it (args that are not objects) are decoded with
#: :data:`_TAGGED_DECODER` (args undecoded), and a ``ph`` outside the format's (or none, or not
#: a string) with :data:`_EVENTS_DECODER`.
# (_SKIPPED is a union built at run time, which mypy cannot read as a type)
_LITE_DECODER = msgspec.json.Decoder(
    list[_LiteComplete | _LiteInstant | _Meta | _SKIPPED])  # type: ignore[valid-type]


_TAGGED_DECODER = msgspec.json.Decoder(
    list[_Complete | _Instant | _Meta | _SKIPPED])  # type: ignore[valid-type]


_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])


_ANY_DECODER = msgspec.json.Decoder()


#: Events decoded at a time by :func:`parse_trace_fast`: a slice's structs become column arrays
#: and are dropped before the next slice is decoded, so a file's events are never all Python
#: objects at once (for a 31 MB trace the parse's peak above the file's bytes fell from 51 to
#: 19 MB; ``benchmarks/bench_report.py``, results in ``benchmarks/README.md``).
SLICE_EVENTS = 8192


_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError,
                  RecursionError)


def parse_trace_fast(raw: bytes | list[bytes], path: Path, display_time_unit_default=None
                     ) -> tuple[dict, tuple] | None:
    """Strict-JSON fast path of reading a trace: the document's metadata and the
    :func:`events_frame` result, decoding only the event fields pardiag uses (msgspec), in
    slices of :data:`SLICE_EVENTS` events. ``raw`` is the decompressed file, or a one-item list
    holding it: then the list is emptied on success so the bytes can be freed before the table
    is built (and left as it was when None is returned).

    Returns:
        ``(metadata, (events, thread_names, warnings, notes))``, or None when the file is not a
        strict-JSON object with a ``traceEvents`` list of objects (then the caller takes the
        tolerant path, :func:`read_trace_bytes` + :func:`events_frame`, which gives the same
        table or the right error).
    """
    holder: list[bytes] | None = None
    if isinstance(raw, list):
        holder, raw = raw, raw[0]
    try:
        split = _split_document(raw)
        if split is None:
            return None
        top, raws = split
        meta = {k: _ANY_DECODER.decode(v) for k, v in top.items()}
    except _DECODE_ERRORS:
        return None
    del top, split
    parts: list[dict] = []
    thread_names: dict = {}
    process_names: dict[str, list[str]] = {}
    keeps: dict = {}
    for start in range(0, len(raws), SLICE_EVENTS):
        part = _slice_part(raws[start:start + SLICE_EVENTS], thread_names, process_names, keeps)
        if part is None:
            return None
        parts.append(part)
    del raws  # the events' undecoded JSON: the last reference to the file's bytes
    if holder is not None:
        holder.clear()
    del raw
    if process_names:
        meta[PROCESS_NAMES_KEY] = process_names
    unit = vocab.DISPLAY_TIME_UNIT.get(meta, display_time_unit_default)
    return meta, frame_from_parts(path, unit, thread_names, 0, parts)


def _split_document(raw: bytes) -> tuple[dict, list] | None:
    """The document's top-level values other than ``traceEvents`` and the events, all as
    undecoded JSON (:class:`msgspec.Raw`); None when it has no ``traceEvents`` list.

    One pass over the events: the document is decoded as :class:`_TopEvents` (which splits the
    event list and skips the other values), and the other values are then read from the
    document with the event list cut out (:func:`_without_events`). Where that cannot be done
    (no events, or the list is not where its events say), the top level is decoded first and the
    event list a second time.

    Raises:
        msgspec.DecodeError, ValueError, ...: (:data:`_DECODE_ERRORS`) the bytes are not strict
            JSON.
    """
    try:
        raws = _TOP_EVENTS_DECODER.decode(raw).traceEvents
    except msgspec.ValidationError:  # not an object with a traceEvents list: said below
        raws = None
    if raws:
        top = _without_events(raw, raws)
        if top is not None:
            return top, raws
    top = _TOP_DECODER.decode(raw)
    if "traceEvents" not in top:
        return None
    return ({k: v for k, v in top.items() if k != "traceEvents"},
            _RAW_LIST_DECODER.decode(top["traceEvents"]))


def _without_events(raw: bytes, raws: list) -> dict | None:
    """The top-level values (undecoded) of the document ``raw`` other than its event list,
    whose events ``raws`` (non-empty) are views into ``raw``: the list is found from where its
    first and last events lie in ``raw`` and replaced by ``[]`` before the (now small) document
    is decoded. None when the list is not where they say, or the document names
    ``traceEvents`` twice."""
    def at(view) -> tuple[int, bytes]:  # where a view into raw starts in it, and its bytes
        return np.frombuffer(view, np.uint8).ctypes.data - base, bytes(view)

    base = np.frombuffer(raw, np.uint8).ctypes.data
    (first, head), (last, tail) = at(raws[0]), at(raws[-1])
    end = last + len(tail)
    if not (0 < first <= last and end <= len(raw)) or raw[first:first + len(head)] != head \
            or raw[last:end] != tail:
        return None
    start, stop = raw.rfind(b"[", 0, first), raw.find(b"]", end)
    if start < 0 or stop < 0 or raw[start + 1:first].strip() or raw[end:stop].strip():
        return None
    top = _TOP_DECODER.decode(b"".join((raw[:start], b"[]", raw[stop + 1:])))
    if bytes(top.pop("traceEvents", b"")) != b"[]":
        return None
    return top


def _decode_slice(raws: list) -> tuple[list, str] | None:
    """The events of ``raws`` (each event's undecoded JSON) decoded with the first of
    :data:`_LITE_DECODER` (``"lite"``), :data:`_TAGGED_DECODER` (``"tagged"``) and
    :data:`_EVENTS_DECODER` (``"plain"``) that takes them all, and which one; None when an
    entry is not an object."""
    data = _joined_array(raws)
    for decoder, kind in ((_LITE_DECODER, "lite"), (_TAGGED_DECODER, "tagged"),
                          (_EVENTS_DECODER, "plain")):
        try:
            return decoder.decode(data), kind
        except msgspec.ValidationError:
            continue
        except _DECODE_ERRORS:
            return None
    return None


def _slice_part(raws: list, thread_names: dict, process_names: dict, keeps: dict
                ) -> dict | None:
    """The :func:`slice_arrays` of one slice of events (each event's undecoded JSON), or None
    when an entry is not an object. The slice's thread and process names are added to
    ``thread_names`` and ``process_names`` (:func:`_names_of`); ``keeps`` caches
    :func:`keeps_args` across slices."""
    decoded = _decode_slice(raws)
    if decoded is None:
        return None
    evs, kind = decoded
    if kind == "plain":
        keep, phs = _split_events(evs, thread_names, process_names)
    else:
        keep, phs, mask = _split_tagged(evs, thread_names, process_names)
    del evs
    get = operator.attrgetter
    names_raw = list(map(get("name"), keep))
    full = keeps_args(names_raw, keeps)
    if kind == "lite":
        arg_cols = _lite_args(list(map(get("args"), keep)), full,
                              list(itertools.compress(raws, mask)))
    else:
        arg_cols = _fast_args(list(map(get("args"), keep)), full)
    durs = list(map(get("dur"), keep))
    if phs.count("X") == len(phs):
        no_dur = durs.count(MISSING)
    else:  # [memory] instants: no duration
        no_dur = sum(1 for d, ph in zip(durs, phs) if ph == "X" and d is MISSING)
        durs = [d if ph == "X" else 0.0 for d, ph in zip(durs, phs)]
    return slice_arrays(
        names_raw=names_raw, cats_raw=list(map(get("cat"), keep)), phs=phs,
        pids_raw=list(map(get("pid"), keep)), tid_raw=list(map(get("tid"), keep)),
        ts_raw=list(map(get("ts"), keep)), dur_raw=durs, no_dur=no_dur, **arg_cols)


def _split_events(evs: list, thread_names: dict, process_names: dict
                  ) -> tuple[list, list]:
    """The decoded events (:class:`_Event`) the table keeps (complete events and ``[memory]``
    instants) and their ``ph``; the names of the metadata events are added to
    ``thread_names`` and ``process_names`` (:func:`_names_of`)."""
    keep = []
    metas = []
    for e in evs:
        ph = e.ph
        if ph == "X" or (ph == "i" and e.name == "[memory]"):
            keep.append(e)
        elif ph == "M":
            metas.append(e)
    _names_of(metas, thread_names, process_names)
    return keep, list(map(operator.attrgetter("ph"), keep))


def _split_tagged(evs: list, thread_names: dict, process_names: dict
                  ) -> tuple[list, list, list[bool]]:
    """:func:`_split_events` of events decoded by their tag (:data:`_LITE_DECODER` or
    :data:`_TAGGED_DECODER`), with the mask of the events kept."""
    # each event's kind as a small integer (C-level maps), not a Python test per event
    codes = np.fromiter(map(_TYPE_CODES.__getitem__, map(type, evs)), np.int8, len(evs))
    keep_mask = codes == 1
    memory = [i for i in np.flatnonzero(codes == 2).tolist() if evs[i].name == "[memory]"]
    keep_mask[memory] = True
    mask = keep_mask.tolist()
    keep = list(itertools.compress(evs, mask))
    phs = ["X"] * len(keep) if not memory else [
        "X" if c == 1 else "i" for c in codes[keep_mask].tolist()]
    _names_of([evs[i] for i in np.flatnonzero(codes == 3).tolist()], thread_names, process_names)
    return keep, phs, mask


def _names_of(metas: list, thread_names: dict, process_names: dict[str, list[str]]) -> None:
    """Add the thread names ``{(pid, tid): name}`` and process names ``{pid: [names]}`` of
    decoded metadata events to ``thread_names`` and ``process_names`` (a later name of a
    thread replaces an earlier one). A metadata event whose name a merge tool prefixed with a
    rank (:func:`pardiag.analyzer.trace.vocab.metadata_name`) is read without it, and its
    process is named ``rank N`` too."""
    for e in metas:
        name, rank = vocab.metadata_name(e.name)
        pid = None if e.pid is MISSING else e.pid
        if rank is not None:   # a merge tool's rank prefix: the process is that rank's
            said = process_names.setdefault(str(pid), [])
            if f"rank {rank}" not in said:
                said.append(f"rank {rank}")
        if e.args is not _NO_ARGS and (
                name == "thread_name" or (type(name) is str and name in PROCESS_META)):
            a = _ANY_DECODER.decode(e.args)
            if not isinstance(a, dict):
                continue
            if name == "thread_name":
                tid = None if e.tid is MISSING else e.tid
                thread_names[(str(pid), str(tid))] = str(vocab.THREAD_NAME.get(a, ""))
            else:
                process_names.setdefault(str(pid), []).append(
                    str(vocab.THREAD_NAME.get(a, vocab.PROCESS_LABELS.get(a, ""))))


def _joined_array(items: list) -> bytes:
    """One JSON array of the JSON values ``items`` (bytes or :class:`msgspec.Raw`), written
    once (``b"[" + b",".join(...) + b"]"`` would copy the joined bytes a second time)."""
    if not items:
        return b"[]"
    pieces = [b"["] + [b","] * (2 * len(items) - 1) + [b"]"]
    pieces[1:-1:2] = items
    return b"".join(pieces)


def _lite_args(lites: list, full: list[bool], raws: list) -> dict:
    """The arg columns of :func:`slice_arrays` from the kept events' :class:`_LiteArgs`
    (None for ``null`` args); ``raws`` are the same events' undecoded JSON, decoded again (all
    at once) for the args the table keeps whole (``full``: :func:`keeps_args`)."""
    n = len(lites)
    if type(None) in set(map(type, lites)):
        lites = [_NO_LITE if a is None else a for a in lites]
    get = operator.attrgetter
    kept: list = [None] * n
    todo = list(itertools.compress(range(n), full))
    if todo:
        whole = _ARGS_LIST_DECODER.decode(_joined_array([raws[i] for i in todo]))
        for i, o in zip(todo, whole):
            if type(o.args) is dict and o.args:
                kept[i] = o.args
    return dict(arg_stream=list(map(get("stream"), lites)),
                arg_queue=list(map(get("sycl_queue"), lites)),
                arg_corr=list(map(get("correlation"), lites)),
                arg_device=list(map(get("device"), lites)), kept_args=kept)


def _fast_args(raws: list, full: list[bool]) -> dict:
    """The arg columns of :func:`slice_arrays` from each kept event's undecoded args
    (:data:`_NO_ARGS` where it has none; ``full``: :func:`keeps_args`).

    Every event's args are read for ``stream``, ``correlation`` and ``sycl queue`` in one decode
    of all of them (one event at a time only when an args value is not a JSON object); those of
    events whose name marks them as kept (communication, memory) are also decoded whole."""
    n = len(raws)
    kept: list = [None] * n
    try:
        lites = _LITE_LIST_DECODER.decode(_joined_array(raws))
    except msgspec.ValidationError:  # an args value that is not an object: one at a time
        lites = None
    if lites is not None:
        get = operator.attrgetter
        stream = list(map(get("stream"), lites))
        queue = list(map(get("sycl_queue"), lites))
        corr = list(map(get("correlation"), lites))
        device = list(map(get("device"), lites))
        del lites
        todo = [i for i in itertools.compress(range(n), full) if len(raws[i]) > 2]
    else:
        stream, queue, corr, device = [MISSING] * n, [MISSING] * n, [-1] * n, [MISSING] * n
        todo = [i for i in range(n) if len(raws[i]) > 2]
    for i in todo:
        a = _ANY_DECODER.decode(raws[i])
        if type(a) is dict:
            if full[i] and a:
                kept[i] = a
            stream[i] = vocab.STREAM.get(a, MISSING)
            queue[i] = vocab.SYCL_QUEUE.get(a, MISSING)
            corr[i] = vocab.CORRELATION.get(a, -1)
            device[i] = vocab.DEVICE.get(a, MISSING)
    return dict(arg_stream=stream, arg_queue=queue, arg_corr=corr, arg_device=device,
                kept_args=kept)
