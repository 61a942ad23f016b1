-- The fair queue's fence (SQLite flavour): a number raised in the same
-- transaction as every lease that processes make from the store on their own,
-- without Redis (the Redis queue's stand-in while Redis cannot be reached).
-- Redis keeps the fence at which it last counted the tasks the store has
-- leased; it picks again only once it has counted them at the store's fence,
-- so a lease Redis did not choose never lets a limit be exceeded.

CREATE TABLE queue_fence (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);

INSERT INTO queue_fence (id, value) VALUES (1, 0);
