"""``plotly.graph_objs``'s Figure and Mesh3d, as far as plot_LDDMM_Surface.py uses them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Mesh3d:
    """A mesh trace: its keyword arguments as attributes (``visible`` can be set)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class Figure:
    """A figure: its traces (``data``) and layout updates."""

    def __init__(self, data: list[Mesh3d] | None = None) -> None:
        self.data: list[Mesh3d] = list(data or [])
        self.layout: dict[str, Any] = {}

    def add_trace(self, trace: Mesh3d) -> None:
        self.data.append(trace)

    def update_layout(self, **kwargs: Any) -> None:
        self.layout.update(kwargs)

    def write_html(self, path: str, auto_open: bool = False) -> None:
        """A one-line HTML file naming the number of traces (the real plotly writes the interactive figure)."""
        Path(path).write_text(f"<html><body>{len(self.data)} traces (plotly stand-in)</body></html>\n")
