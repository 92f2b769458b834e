"""Exposition: metric rows from an attributed sample, and the immutable pre-rendered snapshot
a scrape serves."""
