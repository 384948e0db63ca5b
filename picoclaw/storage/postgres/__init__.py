"""The PostgreSQL backend (optional extra `picoclaw[postgres]`: psycopg 3, psycopg_pool, pgvector)."""
