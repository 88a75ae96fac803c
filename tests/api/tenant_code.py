"""Code a hostile tenant names in ``POST /v1/services``: the server must never import it.
Importing it is visible (``sys.modules``); calling its factory would end this process."""

from __future__ import annotations

import os


def build() -> None:
    os.abort()
