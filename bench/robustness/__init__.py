"""Fault injection against the job command lines."""
