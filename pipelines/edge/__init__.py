"""``esa edge``: the HTTP ingestion edge, the shuffler's front door.

Devices POST their sealed reports to ``/v1/reports`` and enrol at ``/v1/enrol``; ``/v1/keys`` serves the current
keys signed by the shuffler; ``/healthz`` and ``/metrics`` serve operators. The pure rules live in
``transforms.shuffler.edge_rules`` and ``transforms.shuffler.edge_admission``; this package holds the server
(``core`` + one HTTP library adapter), the spool and the metrics. docs/edge.md is the HTTP contract.
"""
