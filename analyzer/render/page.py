"""The page kit every HTML output of pardiag is built with (the report, the comparison): one
self-contained document that opens offline (``templates/base.html``, rendered with the Jinja2
environment :data:`TEMPLATES`), its tables, escaping, and the inert figure data.

**Safety.** Every string that comes from a trace, a sidecar or a file name goes through
:func:`escape` before it reaches the page. Figure data travels as JSON in inert
``<script type="application/json">`` elements (:func:`json_script`) with ``<``, ``>`` and ``&``
escaped; the page's only scripts are plotly.js and :data:`BOOT_JS` (``static/report.js``: it
draws the figures and sorts tables by moving rows, never by writing HTML).

**Size.** plotly.js (about 4.8 MB) is inlined gzip-compressed and base64-encoded (about 1.9 MB)
and unpacked by the browser (``DecompressionStream``); ``include_plotlyjs="cdn"`` links it
instead (:func:`plotly_script`).
"""

from __future__ import annotations

import base64
import datetime
import functools
import gzip
import html
import importlib.resources
import os

import jinja2
import numpy as np
import orjson
import pandas as pd
from markupsafe import Markup
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from pardiag.layout import user_cache_dir
from pardiag.version import __version__

#: Colours of the five breakdown parts, shared by every breakdown chart.
PART_COLORS = {"compute only": "#4C78A8", "overlapped": "#54A24B",
               "exposed comm": "#E45756", "memory copies": "#EECA3B", "idle": "#BAB0AC"}
#: Most rows of any table; the rest are left out and the page says "showing N of M".
MAX_TABLE_ROWS = 200
PLOTLY_CDN_URL = f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"


def _static(name: str) -> str:
    """A file of the page's own CSS or script, shipped in ``pardiag/analyzer/render/static/``."""
    return importlib.resources.files("pardiag.analyzer.render").joinpath("static").joinpath(
        name).read_text(encoding="utf-8")


#: The page's style sheet (``static/report.css``).
CSS = _static("report.css")
#: The page's own script (``static/report.js``): unpack plotly.js, draw every figure, make tables
#: sortable. It reads figure JSON with JSON.parse and moves existing table rows; it never writes
#: HTML.
BOOT_JS = _static("report.js")


def escape(x) -> str:
    """HTML-escape anything (quotes too) for text and attribute values."""
    return html.escape(str(x), quote=True)


def fmt(v, digits: int = 1) -> str:
    """One format per unit, as the terminal prints them: quantities with thousands separators
    (``68,608`` bytes, ``1,053,696`` bytes, ``12.500`` ms), identifiers (:func:`fmt_id`) bare."""
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return escape(v)


def fmt_id(v) -> str:
    """A rank or step number: an identifier, never ``1,024``."""
    return "–" if v is None or (isinstance(v, float) and pd.isna(v)) else escape(v)


_INT_COLUMNS = {"rank", "last_rank", "slowest_rank", "count", "instances", "steps",
                "last_arrivals", "steps_as_top", "size", "nodes", "ranks", "bytes", "step",
                "src", "dst"}
#: Identifier columns: printed bare (every other number is a quantity, with separators).
_ID_COLUMNS = {"rank", "last_rank", "slowest_rank", "step", "src", "dst", "pg"}


def _unprefixed(column: str) -> str:
    """A comparison's column without its side (``a_count``, ``b_instances``, ``delta_count``)."""
    for prefix in ("a_", "b_", "delta_"):
        if column.startswith(prefix):
            return column[len(prefix):]
    return column


def _is_bytes(column: str) -> bool:
    """Byte counts: always whole numbers with thousands separators (``68,608``)."""
    return column == "bytes" or column.endswith("_bytes")


def shown(n_shown: int, n_total: int, what: str) -> str:
    return muted(f"Showing {n_shown} of {n_total} {what}.") if n_shown < n_total else ""


def _whole(v: np.ndarray) -> bool:
    """Every value that is not NaN is a whole number (and finite)."""
    v = v[~np.isnan(v)]
    return bool(np.isfinite(v).all() and (v == np.floor(v)).all())


def table(df: pd.DataFrame, columns: dict[str, str], left: tuple[str, ...] = (),
           digits: int = 1, sortable: bool = False, max_rows: int = MAX_TABLE_ROWS,
           what: str = "rows") -> str:
    """HTML table of ``df``; ``columns`` maps column → header. Values escaped.

    At most ``max_rows`` rows (the first ones; the page then says "Showing N of M <what>").
    ``sortable`` tables sort on a header click; numeric cells carry their value in ``data-v``.
    """
    total = len(df)
    df = df.head(max_rows).copy()
    for c in columns:  # counts and ranks that pandas turned into floats print as integers
        if (_unprefixed(c) in _INT_COLUMNS and pd.api.types.is_float_dtype(df[c])
                and _whole(df[c].to_numpy(dtype=float, na_value=np.nan))):
            df[c] = df[c].astype("Int64")
        elif (_is_bytes(c) and c not in df.attrs.get("mib", ())
              and pd.api.types.is_float_dtype(df[c])):  # a median of byte counts
            df[c] = df[c].round().astype("Int64")
    head = "".join(f'<th class="{"l" if c in left else ""}">{escape(h)}</th>'
                   for c, h in columns.items())
    rows = []
    # column-wise values keep each column's type (iterrows would turn ints into floats)
    for values in zip(*(df[c].astype(object).where(df[c].notna(), None).tolist() for c in columns)):
        cells = []
        for c, v in zip(columns, values):
            num = (isinstance(v, (int, float, np.integer, np.floating))
                   and not isinstance(v, (bool, np.bool_)))
            dv = f' data-v="{float(v)!r}"' if sortable and num else ""
            text = (fmt_id(v) if c in _ID_COLUMNS and num
                    else fmt(v, 2 if c.endswith("_pct") else digits))
            cells.append(f'<td class="{"l" if c in left else ""}"{dv}>{text}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    cls = ' class="pd-sort"' if sortable else ""
    return (f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + shown(len(df), total, what))


def muted(text: str) -> str:
    return f"<p class='muted'>{escape(text)}</p>"


def in_ms(df: pd.DataFrame, cols) -> pd.DataFrame:
    out = df.copy()
    for c in cols:
        out[c] = pd.to_numeric(out[c], errors="coerce") / 1000.0
    return out


def in_mib(df: pd.DataFrame, cols) -> pd.DataFrame:
    """``df`` with ``cols`` (byte counts) in MiB; :func:`table` then prints them with their
    digits instead of as whole byte counts (``df.attrs["mib"]`` names them)."""
    out = df.copy()
    for c in cols:
        out[c] = pd.to_numeric(out[c], errors="coerce") / 2**20
    out.attrs["mib"] = tuple(out.attrs.get("mib", ())) + tuple(cols)
    return out


class Page:
    """Collects figures (as inert JSON) and the notes about what was sampled."""

    def __init__(self) -> None:
        self.n = 0
        self.sampled: list[str] = []

    def fig(self, fig) -> str:
        """A figure's placeholder div and its JSON (template stripped; added once by the page).
        ``fig``: a plotly figure dict (``data``, ``layout``; numeric numpy arrays go in as
        plotly.js typed arrays, :func:`typed_arrays`) or a ``plotly.graph_objects.Figure``."""
        self.n += 1
        fid = f"pd-fig-{self.n}"
        if isinstance(fig, dict):
            spec = {"data": typed_arrays(fig.get("data", [])),
                    "layout": dict(fig.get("layout", {}))}
        else:
            spec = fig.to_plotly_json()
        spec["layout"].pop("template", None)
        spec["layout"].setdefault("margin", {"t": 60})
        return f'<div class="pd-plot" id="{fid}"></div>' + json_script(f"{fid}-data", spec)

    def sample(self, text: str) -> str:
        """Record a reduction for the summary and return it as a note for its section."""
        self.sampled.append(text)
        return muted(text)


#: numpy dtypes plotly.js reads as typed arrays, and their names there.
_TYPED_ARRAY_DTYPES = {"float32": "f4", "float64": "f8", "int8": "i1", "int16": "i2",
                       "int32": "i4", "uint8": "u1", "uint16": "u2", "uint32": "u4"}


def typed_arrays(obj):
    """A copy of a figure spec (dicts and lists) whose numeric numpy arrays are plotly.js typed
    arrays, ``{"dtype": "f4", "bdata": <base64 of the bytes>[, "shape": "rows, cols"]}``: what
    plotly's ``to_plotly_json`` writes for them (int64 narrowed to int32 where it fits, else
    float64), so a page carries 4 bytes per value instead of its decimal text. Other values are
    returned as they are. (plotly's own converter lives in a private module that imports its
    validators, the cost the report avoids; the page test holds the decoded values equal to
    plotly's.)"""
    if isinstance(obj, dict):
        return {k: typed_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [typed_arrays(v) for v in obj]
    if not isinstance(obj, np.ndarray) or obj.size == 0:
        return obj
    a = obj
    if a.dtype.kind in "iu" and str(a.dtype) not in _TYPED_ARRAY_DTYPES:
        fits = np.iinfo(np.int32).min <= a.min() and a.max() <= np.iinfo(np.int32).max
        a = a.astype(np.int32 if fits else np.float64)
    if str(a.dtype) not in _TYPED_ARRAY_DTYPES:
        return a.tolist()
    out = {"dtype": _TYPED_ARRAY_DTYPES[str(a.dtype)],
           "bdata": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")}
    if a.ndim > 1:
        out["shape"] = ", ".join(str(n) for n in a.shape)
    return out


def _json_default(obj):
    """What orjson cannot write itself: numpy arrays it does not take, other objects as text."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def json_script(element_id: str, obj) -> str:
    """``obj`` as JSON in an inert script element; ``<``, ``>``, ``&`` and U+2028/9 escaped so
    no string can end the element or start markup. NaN and infinities are written as ``null``
    (JSON has neither)."""
    text = (orjson.dumps(obj, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
            if not isinstance(obj, (bytes, str)) else obj)
    if isinstance(text, bytes):
        text = text.decode()
    for a, b in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                 ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(a, b)
    return f'<script type="application/json" id="{escape(element_id)}">{text}</script>'


@functools.lru_cache(maxsize=1)
def _packed_plotlyjs() -> str:
    """plotly.min.js, gzip-compressed and base64-encoded (unpacked by the page). Compressing it
    takes a fifth of a second, so it is done once per plotly.js version and kept in the user's
    cache folder (:func:`pardiag.layout.user_cache_dir`); where that folder cannot be written,
    each report compresses it again."""
    cached = user_cache_dir() / f"plotly-{get_plotlyjs_version()}.min.js.gz.b64"
    try:
        text = cached.read_text(encoding="ascii")
        if text:
            return text
    except (OSError, UnicodeDecodeError):
        pass
    text = base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode("ascii")
    _write_cached(cached, text)
    return text


def _write_cached(path, text: str) -> None:
    """Keep ``text`` in the user's cache folder, written whole and then renamed (a report never
    reads half of it); a folder that cannot be written is left alone."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def template_json() -> str:
    """The layout of plotly's default template (``plotly``) as JSON, which the page applies to
    every figure. Building it validates the template through plotly's figure objects (a tenth
    of a second), so it is kept in the user's cache folder per plotly version, as
    :func:`_packed_plotlyjs` keeps plotly.js."""
    import plotly

    cached = user_cache_dir() / f"plotly-{plotly.__version__}-template.json"
    try:
        text = cached.read_text(encoding="utf-8")
        orjson.loads(text)
        return text
    except (OSError, UnicodeDecodeError, orjson.JSONDecodeError):
        pass
    import plotly.io as pio

    text = orjson.dumps(pio.templates["plotly"].layout.to_plotly_json(),
                        option=orjson.OPT_SERIALIZE_NUMPY).decode()
    _write_cached(cached, text)
    return text


def plotly_script(include_plotlyjs) -> tuple[str, str]:
    """``(head, body)`` HTML that brings plotly.js into a page: a CDN ``<script src>`` in the
    head (``"cdn"``), the packed library in the body (true: offline), or nothing (false)."""
    if include_plotlyjs == "cdn":
        return f'<script src="{PLOTLY_CDN_URL}" charset="utf-8"></script>', ""
    if include_plotlyjs:
        return "", (f'<script type="application/octet-stream" id="pd-plotlyjs">'
                    f"{_packed_plotlyjs()}</script>")
    return "", ""


def _escaped(value) -> Markup:
    """What a template writes for ``{{ value }}`` (the environment's ``finalize``): markup
    (anything with ``__html__``: the kit's tables, figures and notes, passed as :class:`Markup`)
    as it is, every other value through :func:`escape`. Autoescaping would escape it too, but
    with markupsafe's spelling of quotes (``&#39;``, ``&#34;``); the page keeps one escaping,
    ``html.escape``'s (``&#x27;``, ``&quot;``), wherever its text comes from."""
    return value if hasattr(value, "__html__") else Markup(escape(value))


#: The pages' templates (``templates/``: ``base.html`` the document, ``report.html`` the
#: report with one template per section under ``sections/``, ``macros.html`` the pieces they
#: share). Autoescaped (:func:`_escaped`); an undefined name is an error, not an empty string.
#: A literal written as ``{{ "text" }}`` would be escaped by markupsafe at compile time:
#: literal text goes into the template as it is, or through a macro's argument.
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("pardiag.analyzer.render", "templates"), autoescape=True,
    finalize=_escaped, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def document_context(title: str, heading: str, subtitle: str, toc,
                     include_plotlyjs: bool | str = True) -> dict:
    """What ``templates/base.html`` shows around a page's body: ``title``, ``heading`` and
    ``subtitle`` (escaped there), pardiag's ``version``, the time it was made (``stamp``,
    local, to the minute), links to the sections (``toc``: ``(id, title)`` pairs), the style
    sheet (:data:`CSS`), and what draws the figures: plotly's template (``figure_template``),
    plotly.js as :func:`plotly_script` brings it (``head_js``, ``packed_plotlyjs``) and
    :data:`BOOT_JS`."""
    head_js, packed = plotly_script(include_plotlyjs)
    return {"title": title, "heading": heading, "subtitle": subtitle, "version": __version__,
            "stamp": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "toc": list(toc),
            "css": Markup(CSS), "head_js": Markup(head_js), "packed_plotlyjs": Markup(packed),
            "figure_template": Markup(json_script("pd-template", template_json())),
            "boot_js": Markup(BOOT_JS)}


def document(title: str, heading: str, subtitle: str, toc, body: str,
             include_plotlyjs: bool | str = True) -> str:
    """One self-contained HTML document (a string; ``templates/base.html``): ``heading`` with
    ``subtitle``, pardiag's version and the time it was made, links to the sections (``toc``:
    ``(id, title)`` pairs), the ``body`` HTML (inserted as it is), and what draws its figures
    (:func:`document_context`). ``title``, ``heading`` and ``subtitle`` are escaped."""
    return TEMPLATES.get_template("base.html").render(
        document_context(title, heading, subtitle, toc, include_plotlyjs), body=Markup(body))
