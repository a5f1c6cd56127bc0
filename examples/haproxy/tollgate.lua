-- HAProxy asking Tollgate before it forwards a request: an `http-request` action that sends the
-- request's head to Tollgate's /forward-auth/{domain} and leaves the answer in variables for
-- haproxy.cfg to act on. It needs HAProxy 2.5 or newer built with Lua (Debian's is), for
-- core.httpclient; nothing else.
--
--   http-request lua.tollgate <domain> <open|closed>
--
-- Variables set:
--   txn.tollgate                 allowed | refused | down (Tollgate could not be asked, or could not
--                                decide, and the action said `closed`) | error (Tollgate refused
--                                the question: a request it cannot read, a domain it has no proxy
--                                block for; a configuration error)
--   txn.tollgate_retry_after     Retry-After, when refused
--   txn.tollgate_ratelimit       the RateLimit field, when a limit applied
--   txn.tollgate_policy          the RateLimit-Policy field, likewise
--
-- Tollgate's address comes from the environment (`setenv TOLLGATE_URL http://127.0.0.1:8080` in the
-- global section). The body is never sent. The client's address is appended to X-Forwarded-For as
-- HAProxy saw it, so Tollgate's default `trusted_hops: 1` takes it and nothing the client wrote.

local tollgate = os.getenv("TOLLGATE_URL") or "http://127.0.0.1:8080"

-- Headers that describe the connection to HAProxy or the body, not the request: never forwarded.
local skipped = {
    ["connection"] = true, ["content-length"] = true, ["transfer-encoding"] = true,
    ["expect"] = true, ["upgrade"] = true, ["te"] = true, ["keep-alive"] = true,
    ["x-forwarded-method"] = true, ["x-forwarded-uri"] = true, ["x-forwarded-host"] = true,
    ["x-forwarded-proto"] = true, ["x-forwarded-for"] = true,
}

-- The value of the first instance of `name` in a header table from HAProxy (values are 0-indexed).
local function first(headers, name)
    local values = headers[name]
    return values and values[0]
end

local function ask(txn, domain, on_failure)
    local request = txn.http:req_get_headers()
    local headers = {}
    for name, values in pairs(request) do
        if not skipped[name] then
            local list, i = {}, 0
            while values[i] ~= nil do
                list[#list + 1] = values[i]
                i = i + 1
            end
            headers[name] = list
        end
    end
    local forwarded = first(request, "x-forwarded-for")
    local client = txn.sf:src()
    headers["x-forwarded-for"] = { forwarded and (forwarded .. ", " .. client) or client }
    headers["x-forwarded-method"] = { txn.sf:method() }
    headers["x-forwarded-uri"] = { txn.sf:pathq() }
    headers["x-forwarded-host"] = { first(request, "host") or "" }
    headers["x-forwarded-proto"] = { txn.sf:ssl_fc() == 1 and "https" or "http" }

    local ok, answer = pcall(function()
        return core.httpclient():get{
            url = tollgate .. "/forward-auth/" .. domain,
            headers = headers,
            -- Tollgate answers in well under a millisecond, and within its store deadline when the
            -- store is slow.
            timeout = 500,
        }
    end)
    -- No answer, or Tollgate could not decide (503): as the action was told.
    if not ok or answer == nil or answer.status == 0 or answer.status >= 500 then
        txn:set_var("txn.tollgate", on_failure == "closed" and "down" or "allowed")
        return
    end
    local fields = answer.headers or {}
    local ratelimit, policy = first(fields, "ratelimit"), first(fields, "ratelimit-policy")
    if ratelimit then txn:set_var("txn.tollgate_ratelimit", ratelimit) end
    if policy then txn:set_var("txn.tollgate_policy", policy) end
    if answer.status >= 200 and answer.status < 300 then
        txn:set_var("txn.tollgate", "allowed")
    elseif answer.status == 429 then
        txn:set_var("txn.tollgate", "refused")
        txn:set_var("txn.tollgate_retry_after", first(fields, "retry-after") or "1")
    else
        txn:set_var("txn.tollgate", "error")
    end
end

core.register_action("tollgate", { "http-req" }, function(txn, domain, on_failure)
    ask(txn, domain, on_failure)
end, 2)
