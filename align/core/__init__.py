"""The bottom layer: facts every other layer may ask for, importing only the standard library,
third-party libraries, align.errors and each other. What an installed callable accepts (signatures),
credentials kept out of what is written (redaction), content hashes (hashing), where caches live
(caches), the few library log records dropped (quiet), and the facts a record states about the code
and the host (provenance)."""
