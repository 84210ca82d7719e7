"""Glue for hosting an agent in other frameworks: ``lifespan.agent_lifespan`` for ASGI apps."""
