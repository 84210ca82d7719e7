"""The standard protocols, each a translation of the service's runs and their event logs."""
