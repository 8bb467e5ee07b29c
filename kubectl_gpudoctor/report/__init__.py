"""What people and bots get: one run's report (table, json, jsonl, yaml) and evidence bundles
(`--save`, `replay`). Collection happens elsewhere; this package only presents and records.
"""
