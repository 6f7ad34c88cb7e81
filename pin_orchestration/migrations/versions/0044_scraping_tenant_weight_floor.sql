-- 0044: a tenant's weight is at least 0.001, as it is at most 1000. A weight only checked
-- > 0 accepted 1e-300: that tenant's picks advanced its tag by 1e300 a job and pushed the
-- class clock past 2**53, where a weight-1 tenant's step of 1 is lost in the double, so
-- every tenant coming back at the clock stood still and one took every pick (below
-- ~1e-306 the tags overflowed and intake failed). From 0.001 a tag grows by at most 1000
-- a job: a billion jobs keep it far inside a double's exact range. A weight set below the
-- floor before this migration is raised to it (that tenant keeps the smallest share there
-- is; left below, it would keep breaking every other tenant's turn).

UPDATE scraping.tenants SET weight = 0.001 WHERE weight < 0.001;
ALTER TABLE scraping.tenants DROP CONSTRAINT tenants_weight_check;
ALTER TABLE scraping.tenants
    ADD CONSTRAINT tenants_weight_check CHECK (weight >= 0.001 AND weight <= 1000);
