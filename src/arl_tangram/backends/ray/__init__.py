"""Shell: the Ray backend: a node agent actor per Ray node that offers ARL-Tangram
resources, proxies that make those agents look local to the controller, the heartbeat
monitor that declares nodes lost and the poller that lets new nodes join.

``ray`` is imported by the modules that need it, never by this package: start with
``from arl_tangram.backends.ray.runtime import start_ray_runtime``.
"""
