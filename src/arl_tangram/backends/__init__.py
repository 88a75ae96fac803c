"""Shell: where node agents live. The local backend is the embedded runtime's in-process
agent (``runtime.embedded``); ``backends.ray`` runs an agent actor per Ray node. Importing
this package imports no backend's dependencies (``ray`` is an optional extra)."""
