"""The integrations use the client only (DESIGN.md §2): of the project they import nothing
but ``arl_tangram.client`` and each other, lazily imported modules included."""

from __future__ import annotations

from tests.test_import_contract import PKG, SRC, imports_of, module_name


def test_integrations_import_only_the_client() -> None:
    files = sorted((PKG / "integrations").glob("*.py"))
    assert len(files) >= 5
    for path in files:
        module = module_name(path)
        project = {m for m in imports_of(path.read_text(), module, path.name == "__init__.py") if m.startswith("arl_tangram")}
        outside = sorted(m for m in project if not m.startswith(("arl_tangram.client", "arl_tangram.integrations")))
        assert not outside, f"{path.relative_to(SRC)} imports {outside}"
