"""The sampling cycle: the sources' answers -> attribution -> every output -> the published snapshot."""
