"""Batch API: files in S3, fan-out into low-priority topics, result collection (to come)."""
