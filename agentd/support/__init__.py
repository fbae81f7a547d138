"""Small building blocks every feature uses: asyncio helpers, lazy imports, rate-limited
logging, the sync bridge for torch's blocking API, and embedded HTTP listeners."""
