"""`flashcheck study`: sweeps that reproduce the published studies, durable records, and the report."""
