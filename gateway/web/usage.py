"""``GET /v1/admin/usage?group=provider|model|chat|day[&days=N]``: the sums of the model
provider usage rows (calls, tokens in, out and both) by one key, from midnight UTC ``days``
days back (1 = today, the default 30). Admin scope (declared in ``admin.py`` with the other
admin routes): chat keys name conversations."""

from __future__ import annotations

from aiohttp import web

from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, array, integer, obj, one_of, string
from gateway.api.state import RUNTIME
from gateway.providers.usage import GROUPS, start_of_day, usage_report

MAX_DAYS = 366


def _days(value: str | None) -> int:
    if value is None:
        return 30
    if not value.isdigit() or not 1 <= int(value) <= MAX_DAYS:
        raise ApiError(400, "bad_request", f"days must be a whole number 1-{MAX_DAYS}")
    return int(value)


COUNT = integer(minimum=0)
USAGE = Operation(
    "Model provider usage summed by one key, from midnight UTC days back",
    {200: Answer("the sums", obj({
        "group": one_of(*GROUPS), "since": string(format="date-time"),
        "rows": array(obj({"key": string("the provider, model, chat or day (YYYY-MM-DD)"),
                           "calls": COUNT, "tokens_in": COUNT, "tokens_out": COUNT,
                           "tokens": COUNT}))}))},
    errors={400: f"group is not one of {', '.join(GROUPS)}, or days not a whole number "
                 f"1-{MAX_DAYS}"},
    params=(Param("group", one_of(*GROUPS, default="provider"),
                  "the key to sum by"),
            Param("days", integer(minimum=1, maximum=MAX_DAYS, default=30),
                  "1 = today")),
    tag="admin")


async def usage(request: web.Request) -> web.Response:
    group = request.query.get("group", "provider")
    if group not in GROUPS:
        raise ApiError(400, "bad_request", f"group must be one of {', '.join(GROUPS)}")
    since = start_of_day(_days(request.query.get("days")) - 1)
    rows = await usage_report(request.app[RUNTIME].pg, group, since)
    return web.json_response({"group": group, "since": since.isoformat(), "rows": rows})
