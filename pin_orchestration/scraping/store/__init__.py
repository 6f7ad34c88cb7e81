"""What the service keeps: the scraping.* tables (the repository) and the fetched bodies
(the results store)."""
