"""Asset `scraping/results`: the result objects worker runs store, one partition per UTC day
(the day a job was accepted, which is also the day in its result key).

Worker runs materialize it imperatively (one AssetMaterialization per day they wrote
results for), so it is declared as a spec: no Dagster run ever "computes" the bytes.
"""

from dagster import AssetKey, AssetSpec, DailyPartitionsDefinition

from pin_orchestration.coordination.job_identity import JobIdentity

SCRAPING_RESULTS = AssetKey(["scraping", "results"])
# The worker job, which the health asset reports on; here, not in jobs/scraping.py,
# because jobs import assets and never the reverse. Its runs record nothing in
# pin.job_runs themselves: a failed one is counted under its Dagster name.
WORKER_JOB = JobIdentity("scraping_worker", records_runs=False)
# end_offset=1: the running day is a partition too, so what workers stored today shows
# (and loads) while the day runs, not only after midnight.
RESULT_DAYS = DailyPartitionsDefinition(start_date="2025-01-01", timezone="UTC", end_offset=1)

scraping_results = AssetSpec(
    key=SCRAPING_RESULTS,
    partitions_def=RESULT_DAYS,
    group_name="scraping",
    description="Fetched pages of scraping jobs, stored in the results store (S3 or the "
    "local store) under results/{tenant}/{yyyy}/{mm}/{dd}/{job}; PostgreSQL keeps only "
    "their metadata. Materialized by scraping_worker runs, one event per day written.",
)
