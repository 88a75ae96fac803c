"""Shell: live benchmark harness. Each module ``bench/<name>.py`` exposes ``main(argv) -> int``.

``arl-tangram bench <name> [--json] ...`` imports the module lazily and calls ``main``.
"""
