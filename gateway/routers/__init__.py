"""Thin HTTP routers, one per resource."""
