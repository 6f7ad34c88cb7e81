"""The scraping API (FastAPI): the app, its routers by resource, what they share, the
problems it answers and the intake that writes POSTed jobs."""
