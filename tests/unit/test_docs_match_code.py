"""The reference pages list what the code has: every option and every system check id.

A new option or check that is not documented fails here, naming what is missing.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import django_fastcache
from django_fastcache.backends.options import FastCacheOptions

PACKAGE = pathlib.Path(django_fastcache.__file__).parent
CONFIGURATION = PACKAGE.parent / "docs" / "configuration.md"


def _check_ids_in(text: str) -> set[str]:
    return set(re.findall(r"django_fastcache\.[EWI]\d{3}", text))


def test_every_option_has_a_row_in_the_configuration_page() -> None:
    page = CONFIGURATION.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.MULTILINE))
    options = {field.name for field in dataclasses.fields(FastCacheOptions)}
    assert options - documented == set(), "options without a row in docs/configuration.md"


def test_every_system_check_id_is_in_the_configuration_page() -> None:
    code = "\n".join(path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py"))
    ids = _check_ids_in(code)
    assert len(ids) > 20  # the scan found the ids (E001 to E051)
    documented = _check_ids_in(CONFIGURATION.read_text(encoding="utf-8"))
    assert ids - documented == set(), "check ids missing from docs/configuration.md"
