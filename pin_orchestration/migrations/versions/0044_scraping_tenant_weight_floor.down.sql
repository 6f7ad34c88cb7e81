-- 0044 down: a weight is checked > 0 again (weights raised to the floor stay raised).

ALTER TABLE scraping.tenants DROP CONSTRAINT tenants_weight_check;
ALTER TABLE scraping.tenants
    ADD CONSTRAINT tenants_weight_check CHECK (weight > 0 AND weight <= 1000);
