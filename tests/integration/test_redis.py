from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest
import redis

from storage.redis import EmbeddedRedis, celery_broker_url, connect, resolve_redis_url

pytestmark = pytest.mark.integration


def test_embedded_redis_starts_answers_ping_and_is_shared_with_a_second_process(tmp_path) -> None:
    embedded = EmbeddedRedis(str(tmp_path / "data")).start()
    embedded_url = embedded.url
    try:
        client = connect(embedded.url)
        assert client.ping() is True
        client.set("written-by", "first process")
        second = textwrap.dedent(f"""
            from storage.redis import resolve_redis_url, connect
            url = resolve_redis_url("", {str(tmp_path / "data")!r})
            client = connect(url)
            print(url)
            print(client.get("written-by").decode())
            client.set("written-by", "second process")
        """)
        result = subprocess.run([sys.executable, "-c", second], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        url, seen = result.stdout.split()[0], " ".join(result.stdout.split()[1:])
        assert url == embedded.url
        assert seen == "first process"
        # The second process has exited: the server must still serve the first.
        assert client.get("written-by") == b"second process"
        client.close()
    finally:
        embedded.stop()
    with pytest.raises(redis.ConnectionError):
        connect(embedded_url).ping()


def test_embedded_redis_stops_when_its_last_holder_lets_go(tmp_path) -> None:
    embedded = EmbeddedRedis(str(tmp_path / "data")).start()
    url = embedded.url
    embedded.stop()
    with pytest.raises(redis.ConnectionError):
        connect(url).ping()


def test_configured_redis_url_is_used_as_is(redis_url: str, tmp_path) -> None:
    assert resolve_redis_url(redis_url, str(tmp_path)) == redis_url
    assert connect(redis_url).ping() is True
    assert not (tmp_path / "redis.db.settings").exists()


def test_celery_spelling_of_a_unix_socket_url() -> None:
    assert celery_broker_url("unix:///tmp/x/redis.socket") == "redis+socket:///tmp/x/redis.socket"
    assert celery_broker_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_process_still_holding_the_server_keeps_it_alive(tmp_path) -> None:
    embedded = EmbeddedRedis(str(tmp_path / "data")).start()
    url = embedded.url
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from storage.redis import resolve_redis_url
            print(resolve_redis_url("", {str(tmp_path / "data")!r}), flush=True)
            sys.stdin.readline()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == url
        embedded.stop()
        # The first process let go, the second still holds the server: it keeps serving.
        assert connect(url).ping() is True
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    # The second process exited without letting go explicitly; its exit hook shuts the server.
    with pytest.raises(redis.ConnectionError):
        connect(url).ping()


@pytest.mark.timeout(30)
def test_a_fail_fast_client_waits_about_a_second_without_retries_and_gives_up_when_redis_does_not_answer() -> None:
    # A server that takes connections and never replies: a default client would wait for ever.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        client = connect(f"redis://127.0.0.1:{port}/0", fail_fast=True)
        connection_settings = client.connection_pool.connection_kwargs
        assert 0 < connection_settings["socket_timeout"] <= 1.0
        assert 0 < connection_settings["socket_connect_timeout"] <= 1.0
        assert client.get_retry().get_retries() == 0
        with pytest.raises(redis.TimeoutError):
            client.get("deepthread:cancel:1")
