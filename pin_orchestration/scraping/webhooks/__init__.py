"""Completion webhooks: their delivery loop and their Standard Webhooks signatures."""
