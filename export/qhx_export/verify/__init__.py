"""Checking a written bundle: the ORT token loop and qhx_generate runs against a float reference."""
