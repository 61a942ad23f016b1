"""Transports: how callers reach the services. Only modules under here import a web
framework; each parses, authorizes, calls a service and serializes its answer.
"""
