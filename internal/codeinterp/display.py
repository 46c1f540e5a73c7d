# vmon's rich results for E2B's SDK, run once in every Python kernel when it starts.
#
# E2B's template gives a pandas DataFrame a `data` result (its columns as lists) and a matplotlib
# figure a `chart` result (what the figure draws, as ChartTypes in @e2b/code-interpreter). They
# travel as two extra MIME types of IPython's display, e2b/data and e2b/chart, which the service
# maps to those keys. This file registers formatters for both.
#
# It imports neither pandas nor matplotlib: a kernel that never uses them never loads them (an
# import here would cost every context start half a second). Objects are recognised by the name
# of their class, and matplotlib's helpers are imported only once a figure exists.
#
# A formatter that fails returns nothing for its type, so the png, html and text of the same
# object still arrive (IPython would otherwise print a traceback and drop only this type).

import datetime as _dt
import math as _math
import re as _re

from IPython import get_ipython as _get_ipython
from IPython.core.formatters import BaseFormatter as _BaseFormatter
from traitlets import ObjectName as _ObjectName
from traitlets import Unicode as _Unicode


def _has_class(obj, module, name):
    return any(c.__name__ == name and c.__module__.startswith(module) for c in type(obj).__mro__)


def _plain(v):
    """A JSON value for one cell or coordinate: NaN and NaT become null, times ISO 8601."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if _math.isfinite(v) else None
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
        try:
            return _plain(v.item())  # numpy and pandas scalars
        except (ValueError, TypeError):
            pass
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)) or hasattr(v, "isoformat"):
        s = str(v)
        if s in ("NaT", "nat"):
            return None
        try:
            return v.isoformat()
        except (ValueError, TypeError):
            return s
    return str(v)


def _dataframe_data(df):
    return {str(col): [_plain(v) for v in df[col].tolist()] for col in df.columns}


# Past this many cells a frame gets no data result: its columns as JSON would take the kernel's
# memory and seconds of transfer for what its html (truncated by pandas) already shows.
_MAX_DATA_CELLS = 200_000


class _DataFormatter(_BaseFormatter):
    format_type = _Unicode("e2b/data")
    print_method = _ObjectName("_repr_e2b_data_")
    _return_type = (dict,)

    def __call__(self, obj):
        if not _has_class(obj, "pandas", "DataFrame") or getattr(obj, "size", 0) > _MAX_DATA_CELLS:
            return None
        try:
            return _dataframe_data(obj)
        except Exception:  # noqa: BLE001 - the html and text of the frame still go out
            return None


# --- charts ---------------------------------------------------------------------------------

_UNIT = _re.compile(r"\(([^()]*)\)\s*$|\[([^\[\]]*)\]\s*$")


def _text(s):
    return s if s else None


def _unit(label):
    m = _UNIT.search(label or "")
    return (m.group(1) or m.group(2)) if m else None


def _scale(axis):
    """linear, log, ... as matplotlib names them; datetime and categorical by the axis's units."""
    conv = type(axis.converter).__module__ if getattr(axis, "converter", None) is not None else ""
    if conv.startswith("matplotlib.dates") or conv.startswith("pandas.plotting"):
        return "datetime"
    if conv.startswith("matplotlib.category"):
        return "categorical"
    return axis.get_scale()


def _decode(axis, scale, v):
    """A coordinate as the user gave it: a time for a datetime axis, a category for a categorical one."""
    if v is None or (isinstance(v, float) and not _math.isfinite(v)):
        return None
    if scale == "datetime":
        from matplotlib.dates import num2date

        try:
            return num2date(float(v)).isoformat()
        except (ValueError, TypeError, OverflowError):
            return _plain(v)
    if scale == "categorical":
        mapping = getattr(getattr(axis, "units", None), "_mapping", None) or {}
        for name, pos in mapping.items():
            if pos == v:
                return _plain(name)
    return _plain(v)


class _Axis:
    def __init__(self, axis):
        self.axis = axis
        self.scale = _scale(axis)

    def value(self, v):
        return _decode(self.axis, self.scale, v)

    def _shown(self):
        """The ticks inside the axis's view, with their labels (matplotlib also places some outside)."""
        lo, hi = sorted(float(v) for v in self.axis.get_view_interval())
        eps = (hi - lo) * 1e-9
        return [(loc, t.get_text()) for loc, t in zip(self.axis.get_ticklocs(), self.axis.get_ticklabels())
                if lo - eps <= loc <= hi + eps]

    def ticks(self):
        return [self.value(loc) for loc, _ in self._shown()]

    def tick_labels(self):
        return [text for _, text in self._shown()]

    def label_at(self, pos):
        """The tick label at data position pos, else the position itself as text."""
        for loc, t in zip(self.axis.get_ticklocs(), self.axis.get_ticklabels()):
            if abs(loc - pos) < 1e-9 and t.get_text():
                return t.get_text()
        v = self.value(pos)
        return v if isinstance(v, str) else str(v)


def _objects(ax):
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)
    if children is None:
        children = list(ax.lines) + list(ax.collections) + list(ax.patches)
    return [c for c in children if not isinstance(c, Text)]


def _kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    objs = _objects(ax)
    if not objs:
        return "unknown"
    if all(isinstance(o, Line2D) for o in objs):
        return "line"
    if all(isinstance(o, PathCollection) for o in objs):
        return "scatter"
    if all(isinstance(o, Wedge) for o in objs):
        return "pie"
    if all(isinstance(o, Rectangle) for o in objs) and ax.containers:
        return "bar"
    if any(isinstance(o, PathPatch) for o in objs) and all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return "box_and_whisker"
    return "unknown"


def _base(ax, kind):
    return {"type": kind, "title": _text(ax.get_title()), "elements": []}


def _two_d(ax, kind, swap=False):
    c = _base(ax, kind)
    x, y = ax.get_xlabel(), ax.get_ylabel()
    if swap:  # the categories run along y: x_label names them, as for vertical charts
        x, y = y, x
    c.update(x_label=_text(x), y_label=_text(y), x_unit=_unit(x), y_unit=_unit(y))
    return c


def _points(ax, kind):
    c = _two_d(ax, kind)
    xa, ya = _Axis(ax.xaxis), _Axis(ax.yaxis)
    c.update(x_scale=xa.scale, y_scale=ya.scale, x_ticks=xa.ticks(), y_ticks=ya.ticks(),
             x_tick_labels=xa.tick_labels(), y_tick_labels=ya.tick_labels())
    if kind == "line":
        for line in ax.get_lines():
            xs = line.get_xdata(orig=False)
            ys = line.get_ydata(orig=False)
            pts = [[xa.value(a), ya.value(b)] for a, b in zip(xs, ys)]
            c["elements"].append({"label": str(line.get_label()), "points": pts})
    else:
        for coll in ax.collections:
            pts = [[xa.value(a), ya.value(b)] for a, b in coll.get_offsets()]
            c["elements"].append({"label": str(coll.get_label()), "points": pts})
    return c


def _group(label, i):
    # matplotlib names an unlabelled container "_container<n>"; E2B shows it as "Group <n>".
    return label if label and not label.startswith("_") else "Group %d" % i


def _bars(ax):
    horizontal = any(getattr(cont, "orientation", None) == "horizontal" for cont in ax.containers)
    c = _two_d(ax, "bar", swap=horizontal)
    cats = _Axis(ax.yaxis if horizontal else ax.xaxis)
    for i, cont in enumerate(ax.containers):
        group = _group(cont.get_label(), i)
        for rect in cont:
            if horizontal:
                pos, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                pos, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            c["elements"].append({"label": cats.label_at(pos), "value": _plain(value), "group": group})
    return c


def _pie(ax):
    from matplotlib.patches import Wedge

    c = _base(ax, "pie")
    for w in ax.patches:
        if isinstance(w, Wedge):
            c["elements"].append({"label": str(w.get_label()), "angle": round(abs(w.theta2 - w.theta1), 4),
                                  "radius": _plain(w.r)})
    return c


def _boxes(ax):
    from matplotlib.patches import PathPatch

    patches = [p for p in ax.patches if isinstance(p, PathPatch)]
    spans = []
    for p in patches:
        v = p.get_path().vertices
        spans.append((float(v[:, 0].min()), float(v[:, 0].max()), float(v[:, 1].min()), float(v[:, 1].max())))
    # Boxes side by side along x share their width: a vertical plot (values up the y axis).
    vertical = len({round(s[1] - s[0], 9) for s in spans}) <= 1
    c = _two_d(ax, "box_and_whisker", swap=not vertical)
    cats = _Axis(ax.xaxis if vertical else ax.yaxis)
    boxes = []
    for lo_c, hi_c, lo_v, hi_v in spans:
        if not vertical:  # swap to (category span, value span)
            lo_c, hi_c, lo_v, hi_v = lo_v, hi_v, lo_c, hi_c
        boxes.append({"cat": (lo_c, hi_c), "q1": lo_v, "q3": hi_v, "median": None, "min": lo_v,
                      "max": hi_v, "outliers": []})
    eps = 1e-9
    for line in ax.get_lines():
        cs, vs = line.get_xdata(orig=False), line.get_ydata(orig=False)
        if not vertical:
            cs, vs = vs, cs
        cs, vs = [float(a) for a in cs], [float(b) for b in vs]
        if not cs:
            continue
        box = next((b for b in boxes if all(b["cat"][0] - eps <= a <= b["cat"][1] + eps for a in cs)), None)
        if box is None:
            continue
        if line.get_linestyle() in ("None", "none", "", " "):  # markers only: the fliers
            box["outliers"].extend(v for v in vs if _math.isfinite(v))
            continue
        if len(vs) != 2:
            continue
        lo, hi = min(vs), max(vs)
        if abs(vs[0] - vs[1]) < eps and box["q1"] - eps <= lo <= box["q3"] + eps and len(set(cs)) == 2:
            if box["median"] is None:
                box["median"] = lo
        elif abs(hi - box["q1"]) < eps:
            box["min"] = min(box["min"], lo)
        elif abs(lo - box["q3"]) < eps:
            box["max"] = max(box["max"], hi)
    for b in boxes:
        c["elements"].append({
            "label": cats.label_at((b["cat"][0] + b["cat"][1]) / 2),
            "min": b["min"], "first_quartile": b["q1"],
            "median": b["median"],  # None when the plot draws no median line
            "third_quartile": b["q3"], "max": b["max"], "outliers": b["outliers"],
        })
    return c


def _chart(ax):
    kind = _kind(ax)
    if kind in ("line", "scatter"):
        return _points(ax, kind)
    if kind == "bar":
        return _bars(ax)
    if kind == "pie":
        return _pie(ax)
    if kind == "box_and_whisker":
        return _boxes(ax)
    return _base(ax, "unknown")


# Past this many points in all a figure gets no chart, for the reason frames get no data.
_MAX_CHART_POINTS = 200_000


def _point_count(ax):
    n = sum(len(line.get_xdata(orig=False)) for line in ax.get_lines())
    return n + sum(len(c.get_offsets()) for c in ax.collections)


def _figure_chart(fig):
    axes = fig.get_axes()
    if not axes or sum(_point_count(ax) for ax in axes) > _MAX_CHART_POINTS:
        return None
    if len(axes) == 1:
        return _chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": _text(title), "elements": [_chart(ax) for ax in axes]}


class _ChartFormatter(_BaseFormatter):
    format_type = _Unicode("e2b/chart")
    print_method = _ObjectName("_repr_e2b_chart_")
    _return_type = (dict,)

    def __call__(self, obj):
        if not _has_class(obj, "matplotlib", "Figure"):
            return None
        try:
            return _figure_chart(obj)
        except Exception:  # noqa: BLE001 - the png of the figure still goes out
            return None


_shell = _get_ipython()
if _shell is not None:
    _formatters = _shell.display_formatter.formatters
    _formatters["e2b/data"] = _DataFormatter(parent=_shell.display_formatter)
    _formatters["e2b/chart"] = _ChartFormatter(parent=_shell.display_formatter)


# PIL images, as E2B's template has them: Image.show() and Image.save(<path>) display the image
# (a png result), and a viewer is never started (there is no display). PIL is patched as a cell
# imports it (an import hook), never imported here.
def _patch_pil():
    import sys

    image_mod = sys.modules.get("PIL.Image")
    if image_mod is None or getattr(image_mod, "_vmon_patched", False):
        return
    from IPython.display import display

    try:
        from PIL import ImageShow
    except Exception:  # noqa: BLE001 - without ImageShow, show() is left as it is
        ImageShow = None

    image_class = image_mod.Image
    original_save = image_class.save

    def show(self, title=None, **_options):
        display(self)

    def save(self, fp, format=None, **params):
        if isinstance(fp, (str, bytes)) or hasattr(fp, "__fspath__"):
            display(self)
        return original_save(self, fp, format, **params)

    image_class.show = show
    image_class.save = save
    if ImageShow is not None:
        # Code that calls ImageShow directly displays too, and no viewer program is run.
        ImageShow.show = lambda image, title=None, **_options: (display(image), True)[1]
    image_mod._vmon_patched = True


class _PILImportHook:
    """Patches PIL.Image right after it is first imported, wherever the import comes from."""

    def find_spec(self, name, path, target=None):
        if name != "PIL.Image":
            return None
        import sys

        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_patch(module):
            exec_module(module)
            try:
                _patch_pil()
            except Exception:  # noqa: BLE001 - PIL works as it is without the patch
                pass

        loader.exec_module = exec_and_patch
        return spec


if _shell is not None:
    import sys as _sys

    if "PIL.Image" in _sys.modules:
        _patch_pil()
    else:
        _sys.meta_path.insert(0, _PILImportHook())
