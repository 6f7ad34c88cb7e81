-- Migration 0014: scraping: Standard Webhooks secrets and their rotation overlap (issue 18).

ALTER TABLE scraping.tenants
    ADD COLUMN webhook_secret_previous text,
    ALTER COLUMN webhook_secret SET DEFAULT
        'whsec_' || encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                           'base64');
