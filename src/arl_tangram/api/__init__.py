"""Shell: the HTTP service: the native ``/v1`` API (``create_app``) and its uvicorn runners."""

from arl_tangram.api.app import create_app

__all__ = ["create_app"]
