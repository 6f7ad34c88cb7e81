-- 0022: a token spend changes no indexed column, and its page has room for the new version.
DROP INDEX scraping.ix_domains_tokens_at;
ALTER TABLE scraping.domains SET (fillfactor = 50);
