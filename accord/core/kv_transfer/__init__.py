"""KV transfer between engines: the connector interface (base.py, vLLM v1's shape),
its config (`--kv-transfer-config`), and the connectors (factory.py)."""
