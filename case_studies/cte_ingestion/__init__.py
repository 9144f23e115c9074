"""High-volume CTE ingestion (FSMA 204): the event contract and synthetic stream, the ledger, the metrics."""
