"""Configured agents: ``AGENT_CONFIG`` → one ``AgentCore`` per agent.

::

    config.py        the TOML file of named agents, read and validated
    capabilities.py  its capability models (embeddings, rerank, media, speech)
    build.py         building each agent's core from its profile; preflight and warm-up
    health.py        each agent's warm-up state (/readyz, refusing its runs)
"""
