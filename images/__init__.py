"""Workspace image recipes, shipped inside the daemon distribution as ``sandboxd_images``."""
