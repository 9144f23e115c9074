"""Bulk Bill-of-Lading ingestion: a carrier's IFCSUM manifest, one unit per consignment, split, parsed and keyed."""
