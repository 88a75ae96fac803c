"""Shell: adapters that let RL frameworks use ARL-Tangram by a class name or a URL: verl's
tool and reward function, a mini-swe-agent / SkyRL environment, a SWE-ReX deployment.

They use the client only (``arl_tangram.client``: the import-contract test holds them to
it), so they work the same against an embedded runtime or a server. Each framework is an
optional dependency, imported only by the module that adapts it.
"""
