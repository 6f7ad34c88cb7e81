-- Migration 0014 down: back to 0013.

ALTER TABLE scraping.tenants
    DROP COLUMN webhook_secret_previous,
    ALTER COLUMN webhook_secret SET DEFAULT
        'whsec_' || replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
