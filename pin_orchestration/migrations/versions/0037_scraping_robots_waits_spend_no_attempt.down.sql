-- 0037 down: robots.txt waits count as attempts again.
ALTER TABLE scraping.jobs DROP COLUMN robots_waits;
