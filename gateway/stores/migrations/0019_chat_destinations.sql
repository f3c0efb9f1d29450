-- Chats as notification destinations.
--
-- A chat subscribes (/subscribe <topic>) to what its linked account may read: the topic
-- patterns of the credential that asked for the link code, kept with the code and then with
-- the link (links made before this read nothing through them until linked again).
ALTER TABLE link_codes ADD COLUMN topics text[] NOT NULL DEFAULT '{}';
ALTER TABLE chat_links ADD COLUMN topics text[] NOT NULL DEFAULT '{}';

-- The message a chat subscription is posting ({topic, from, to, mark}), written before the
-- post and cleared by the cursor move after it: a successor that finds it set asks the
-- platform whether the message is there (the mark rides in its metadata) before posting.
ALTER TABLE subscriptions ADD COLUMN sending jsonb;

-- A chat's own subscriptions (/subscriptions, /unsubscribe) are found by their destination.
CREATE INDEX subscriptions_destination ON subscriptions (destination);
