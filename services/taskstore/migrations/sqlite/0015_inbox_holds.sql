-- A blocking SpawnSubtask answers with the child it waited for: the child's
-- completion is kept for that answer until `awaited_until`, out of the
-- owner's inbox and of unnamed AwaitSubtasks, which reported it as well when
-- they read it first. The spawn takes it, or lets it go, as its wait ends.
ALTER TABLE taskstore_tasks ADD COLUMN awaited_until BIGINT;

-- A ReadInbox with an ack deadline hides the messages it returns from other
-- reads until `invisible_until`; an AckInbox marks them read. One the reader
-- never acknowledged (its reply was lost, it crashed) is read again.
ALTER TABLE taskstore_inbox ADD COLUMN invisible_until BIGINT;
