-- 0022 down: 0007's index of when each domain last spent a token, and full pages.
ALTER TABLE scraping.domains RESET (fillfactor);
CREATE INDEX ix_domains_tokens_at ON scraping.domains (tokens_at);
