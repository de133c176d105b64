"""The one door to a truthful run: compose and refuse bad input (cli), the pre-launch checks
(preflight_checks, checklist, kwargs_sites, model_checks), the manifest (manifest) and the run around the
trainer that writes it (record)."""
