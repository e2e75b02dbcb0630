"""Sphinx configuration for the bnnsfw documentation.

Build (what CI runs; warnings are errors):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Pages are Markdown, read by myst-parser; the API reference (``api.md``) is generated from
the numpydoc-style docstrings by autodoc and napoleon. Only Sphinx's own theme is used, and
nothing is fetched at build time (no intersphinx), so the build works offline.
"""

from __future__ import annotations

import os
import re
import sys

# Document the source tree this file belongs to, installed or not.
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)

import bnnsfw  # noqa: E402  (after the path is set)

# -- Project ----------------------------------------------------------------------------
project = "bnnsfw"
author = "the bnnsfw authors"
copyright = "the bnnsfw authors"
release = bnnsfw.__version__
version = ".".join(release.split(".")[:2])

# -- General ----------------------------------------------------------------------------
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
language = "en"
# Section headings only in the navigation: one entry per documented object would bury them.
toc_object_entries = False

# Not nitpicky: the docstrings use numpydoc's free-form types ("array (L, D, H)", "int or
# None"), which nitpicky mode would turn into hundreds of unresolvable references. Everything
# else Sphinx checks (broken links between pages, unknown directives, malformed docstrings,
# duplicate descriptions, pages outside the toctree) is an error under -W.
nitpicky = False

# -- MyST -------------------------------------------------------------------------------
myst_heading_anchors = 3  # "page.md#a-heading" links resolve, as they do on GitHub

# -- autodoc / napoleon -----------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"  # types beside each parameter, not in long signatures
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "mixed"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_preprocess_types = True  # type specs read as types, so "(N, *input_shape)" is not reST emphasis

# -- HTML -------------------------------------------------------------------------------
html_theme = "alabaster"
# Wide enough for the 110-column code of the recipes and the comparison tables.
html_theme_options = {"page_width": "1340px", "sidebar_width": "220px", "body_max_width": "none"}
html_title = f"bnnsfw {release}"
html_static_path: list[str] = []


def _plain_class_defaults(app, what, name, obj, options, signature, return_annotation):
    """Show a class default as ``dtype=numpy.float32`` rather than ``<class 'numpy.float32'>``."""
    if signature:
        signature = re.sub(r"<class '([\w.]+)'>", r"\1", signature)
    return signature, return_annotation


def setup(app):
    app.connect("autodoc-process-signature", _plain_class_defaults)
