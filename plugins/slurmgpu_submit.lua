--[[
slurmgpu_submit.lua -- slurmgpu's job_submit logic as a Lua module: rightsize opted-in
submissions from the daemon's recommendations.

USE
  Slurm loads one job_submit.lua. plugins/job_submit.lua is a thin script over this module
  for a site that has none; a site with its own script requires the module and calls it:

      package.path = "/etc/slurm/?.lua;" .. package.path   -- where this file is
      local slurmgpu = require("slurmgpu_submit")
      slurmgpu.configure({
         recommendations_file = "/etc/slurmgpu/recommendations.tsv",
         apply_to_all = false,
      })
      function slurm_job_submit(job_desc, part_list, submit_uid)
         -- the site's own checks first; a refused job need not be rightsized
         return slurmgpu.job_submit(job_desc, part_list, submit_uid)
      end
      function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
         return slurmgpu.job_modify(job_desc, job_rec, part_list, modify_uid)
      end

  job_submit(job_desc, part_list, submit_uid) and job_modify(job_desc, job_rec,
  part_list, modify_uid) return a Slurm code, always slurm.SUCCESS: slurmgpu never refuses
  a job. configure() raises on an unknown setting or a wrong type (a typo in the site's
  script shows when slurmctld loads it). slurmctld reloads job_submit.lua when that file
  changes, not when this module does: touch job_submit.lua after replacing this file. The
  recommendations file is re-read at every submission (the daemon replaces it atomically).
  Only the standard Lua library is used (io, string, table): no lua-cjson, no luaposix.

OPT-IN
  A job is rightsized when its --comment contains the token
      sgpu:rightsize
  (`sgpu submit` adds it), or for every job when the site sets apply_to_all = true;
  the token sgpu:norightsize then opts a job out (it wins over sgpu:rightsize). Tokens are
  whole words separated by ASCII whitespace, commas or semicolons, matched exactly. The comment is the portable channel: a "#SGPU rightsize" line in the batch
  script would be visible only in job_desc.script (batch jobs, not salloc/srun, and only by
  scanning the whole script), environment variables are only readable for batch jobs, and
  --comment survives in squeue/sacct for the daemon to see.

  A token sgpu:malleable=MIN:MAX (1 <= MIN <= MAX GPUs) marks a malleable job, and
  sgpu:pool=MIN:MAX an array pool (tasks running at once); MIN and MAX are 1 to 6 digits,
  and the first well-formed one of either counts. The plugin only logs it (one line) and
  leaves the job as submitted: the daemon reads the token from the comment. (job_desc.
  admin_comment is settable from Lua, but the daemon already uses AdminComment for its
  usage summaries, so it is not touched here.)

  These are the rules of slurmgpu/tokens.py (the daemon's side); both are tested against
  tests/vectors/sgpu_tokens.json. Change them together.

WHAT IS LOWERED (never raised; unset requests are left unset except the time limit)
  time limit   job_desc.time_limit (minutes). Unset (NO_VAL) counts as the partition's
               DefaultTime, else its MaxTime (INFINITE is above everything). Never set
               below the job's --time-min.
  memory       job_desc.min_mem_per_node (MiB), only for --mem=N with N > 0. --mem-per-cpu
               (min_mem_per_cpu), --mem-per-gpu and --mem=0 (all of the node) are left alone.
               (pn_min_memory is not used: it is 64-bit with the MEM_PER_CPU flag in bit 63,
               which Lua's doubles cannot hold exactly; min_mem_per_node is the safe view.)
  CPUs         single-task jobs only (-n unset or 1, no --ntasks-per-node, no --cpus-per-gpu):
               min_cpus, and cpus_per_task / pn_min_cpus when set (-c N sets all three; lowering
               only min_cpus leaves MinCPUsNode at N). When memory is per CPU (--mem-per-cpu or
               the partition's DefMemPerCPU) the CPUs stay enough for the recommended memory,
               and are not lowered without a memory recommendation.
  GPUs         the count of the single gpu entry of job_desc.tres_per_node (--gres=gpu:N,
               --gpus-per-node=N), never below 1. The spelling is kept exactly as Slurm gave
               it: "gres:gpu:N" (22.05) or "gres/gpu:N" (newer); 22.05 rejects the job with
               "Invalid Trackable RESource (TRES) specification" if the prefix is changed.
               --gpus (tres_per_job) and --gpus-per-task are left alone; so are jobs with
               --mem-per-gpu (memory would shrink with the GPUs) and the GPU count of
               malleable jobs (the resize policy owns it).
  Multi-node requests (-N > 1) get only the time limit lowered.

RECOMMENDATIONS FILE (written by the daemon: slurmgpu.daemon.recommend)
  A TSV next to the daemon's recommendations.json, chosen over parsing the JSON here because
  a line format needs no parser of our own inside slurmctld (a hand-written JSON parser is
  more code to get wrong in the one process that must never fail), its rows are found with
  a plain substring search (about 4 ms for 100k rows, most of it reading the file; the
  daemon caps the export at 50k rows) and parsed with one pattern, and a bad row is
  refused on its own terms:
      # slurmgpu recommendations v1
      # generated_at=1733150000
      # key<TAB>time_limit_min<TAB>mem_mib<TAB>cpus<TAB>gpus<TAB>samples
      alice|train|gpu<TAB>120<TAB>1500<TAB>4<TAB>1<TAB>12
      alice<TAB>240<TAB>-<TAB>-<TAB>-<TAB>30
      # end 2
  "user|job name|partition" keys first, then the per-user fallback ("user"); "-" = no
  recommendation. The first line must match exactly and "# end N" must be the last line, so
  a truncated or foreign file is refused as a whole; the rows the job needs are parsed
  strictly (the daemon checks every row when it writes the file).

FAILURES
  Every failure (no file, unreadable, malformed line, unexpected field types, any Lua
  error) lets the job through unchanged and logs exactly one "slurmgpu: ..." line with
  slurm.log_info. Changes are planned first and applied last (undone if Slurm refuses one),
  so an error never leaves a job half-changed. Every opted-in job gets exactly one
  rightsizing line (changed, not below the request, no recommendation, or unavailable);
  a malleable token adds one more. Jobs that did not opt in are not logged.
  job_modify is not involved: it returns SUCCESS untouched.
--]]

local M = {}

-- ------------------------------------------------------------------ settings (configure)
local settings = {
   -- The TSV the daemon writes (its JSON export path with the suffix .tsv).
   recommendations_file = "/etc/slurmgpu/recommendations.tsv",
   -- true: rightsize every job that does not carry sgpu:norightsize.
   apply_to_all = false,
}
local SETTING_TYPES = { recommendations_file = "string", apply_to_all = "boolean" }
-- ------------------------------------------------------------------

local OPT_IN = "sgpu:rightsize"
local OPT_OUT = "sgpu:norightsize"
local MALLEABLE = "sgpu:malleable="
local POOL = "sgpu:pool="
local HEADER = "# slurmgpu recommendations v1"

local NO_VAL = 4294967294
local NO_VAL16 = 65534
local INFINITE = 4294967295

local function log(msg)
   -- user-controlled text (names, comments) goes through "%s", never as the format
   local text = "slurmgpu: " .. string.gsub(tostring(msg), "%c", "?")
   pcall(slurm.log_info, "%s", text)
end

-- numbers as integers whatever the Lua version (5.3+ pushes Slurm's numbers as floats)
local function show(v)
   if type(v) == "number" and v == math.floor(v) and v >= 0 and v < 2 ^ 53 then
      return string.format("%d", v)
   end
   return tostring(v)
end

local function tokens(comment)
   local out = {}
   if type(comment) ~= "string" then
      return out
   end
   for tok in string.gmatch(comment, "[^%s,;]+") do
      out[#out + 1] = tok
   end
   return out
end

local function is_set(value, unset)
   return type(value) == "number" and value ~= unset and value ~= NO_VAL and value ~= INFINITE
end

local function fail(reason)
   error({ reason = reason }, 0)
end

-- job_desc fields by the type Slurm gives them; anything else is a failure (job unchanged)
local function num(job_desc, field)
   local v = job_desc[field]
   if v ~= nil and type(v) ~= "number" then
      fail("job_desc." .. field .. " is a " .. type(v) .. ", not a number")
   end
   return v
end

local function str(job_desc, field)
   local v = job_desc[field]
   if v ~= nil and type(v) ~= "string" then
      fail("job_desc." .. field .. " is a " .. type(v) .. ", not a string")
   end
   return v
end

-- ------------------------------------------------------------------ recommendations

local ROW = "^([^\t]+)\t([^\t]+)\t([^\t]+)\t([^\t]+)\t([^\t]+)\t([^\t]+)$"

local function parse_count(field, what)
   if field == "-" then
      return nil
   end
   if not string.find(field, "^%d+$") then
      fail("malformed line for " .. what)
   end
   return tonumber(field)
end

-- The row of `key` in `content` (a whole file), parsed strictly, or nil when absent.
local function find_row(content, key)
   if key == nil or string.find(key, "%c") then
      return nil
   end
   local at = string.find(content, "\n" .. key .. "\t", 1, true)
   if at == nil then
      return nil
   end
   local stop = string.find(content, "\n", at + 1, true)
   local line = string.sub(content, at + 1, (stop or 0) - 1)
   local k, t, m, c, g, s = string.match(line, ROW)
   if k ~= key then
      fail("malformed line for " .. key)
   end
   return {
      time_limit_min = parse_count(t, key),
      mem_mib = parse_count(m, key),
      cpus = parse_count(c, key),
      gpus = parse_count(g, key),
      samples = parse_count(s, key),
   }
end

-- Returns the rows of key and fallback_key (either may be nil), or raises {reason = ...}.
-- Checked per submission: the exact v1 header, the "# end N" trailer as the last line
-- (a truncated or foreign file has neither), and the rows used. Every row is checked by
-- the daemon when it writes the file; scanning all of them here at every submission would
-- cost ~2 ms per 1000 rows inside slurmctld, a plain search costs next to nothing.
local function read_recommendations(path, key, fallback_key)
   local f, err = io.open(path, "r")
   if not f then
      fail("cannot open " .. path .. ": " .. tostring(err))
   end
   local content, rerr = f:read("*a")
   f:close()
   if type(content) ~= "string" then
      fail("cannot read " .. path .. ": " .. tostring(rerr))
   end
   if content == "" then
      fail(path .. " is empty")
   end
   if string.sub(content, 1, #HEADER + 1) ~= HEADER .. "\n" then
      fail(path .. " is not a slurmgpu v1 recommendations file")
   end
   if not string.find(string.sub(content, -40), "\n# end %d+\n$") then
      fail(path .. " has no end line (truncated?)")
   end
   return find_row(content, key), find_row(content, fallback_key)
end

-- ------------------------------------------------------------------ the job

-- The partition a job will run in when that is one name: --partition, else the default.
local function partition_of(job_desc, part_list)
   local p = str(job_desc, "partition")
   if type(p) == "string" and p ~= "" then
      if string.find(p, ",", 1, true) then
         return nil, nil
      end
      return p, type(part_list) == "table" and part_list[p] or nil
   end
   if type(part_list) == "table" then
      for name, part in pairs(part_list) do
         if part.flag_default == 1 then
            return name, part
         end
      end
   end
   return nil, nil
end

-- {prefix=..., head=..., count=N, index=i, entries={...}} of the one gpu entry, or nil.
local function gpu_entry(tres)
   if type(tres) ~= "string" or tres == "" then
      return nil
   end
   local entries, hit = {}, nil
   for entry in string.gmatch(tres, "[^,]+") do
      entries[#entries + 1] = entry
      local rest = string.match(entry, "^gres[:/]gpu(.*)$") or string.match(entry, "^gpu(.*)$")
      if rest ~= nil and (rest == "" or string.sub(rest, 1, 1) == ":") then
         if hit ~= nil then
            return nil -- several gpu entries (typed GPUs): leave them alone
         end
         local head, count = string.match(entry, "^(.*:)(%d+)$")
         if head == nil or string.find(head, "^gres[:/]$") or head == "" then
            return nil -- "gres:gpu" (count implied) or something unexpected
         end
         hit = { head = head, count = tonumber(count), index = #entries }
      end
   end
   if hit == nil then
      return nil
   end
   hit.entries = entries
   return hit
end

-- The fewest CPUs that keep enough memory, or nil when CPUs must not be lowered.
-- Memory per node (the job's --mem, or the partition's DefMemPerNode) does not depend on
-- the CPU count: 1. Memory per CPU (--mem-per-cpu, or the partition's DefMemPerCPU) must
-- still cover the recommended memory: ceil(mem_mib / per_cpu). Anything else: unknown.
local function cpu_floor(job_desc, part, rec)
   if num(job_desc, "min_mem_per_node") ~= nil then
      return 1
   end
   local per_cpu = num(job_desc, "min_mem_per_cpu")
   if type(per_cpu) ~= "number" and part ~= nil then
      if type(part.def_mem_per_node) == "number" then
         return 1
      end
      per_cpu = part.def_mem_per_cpu
   end
   if type(per_cpu) ~= "number" or per_cpu <= 0 or rec.mem_mib == nil then
      return nil
   end
   return math.ceil(rec.mem_mib / per_cpu)
end

-- Plan the changes (pure: reads job_desc only). Returns a list of {field, old, new, unit}.
local function plan(job_desc, part, rec, malleable)
   local changes = {}
   local function lower(field, old, new, unit)
      changes[#changes + 1] =
         { field = field, orig = job_desc[field], old = old, new = new, unit = unit }
   end

   -- time limit (minutes)
   local want = rec.time_limit_min
   if want ~= nil and want >= 1 then
      local req = num(job_desc, "time_limit")
      local effective = nil
      if type(req) == "number" and req ~= NO_VAL then
         effective = req
      elseif part ~= nil then
         if is_set(part.default_time, NO_VAL) then
            effective = part.default_time
         elseif type(part.max_time) == "number" and part.max_time ~= NO_VAL then
            effective = part.max_time
         end
      end
      local tmin = num(job_desc, "time_min")
      if is_set(tmin, NO_VAL) and tmin > want then
         want = tmin
      end
      if effective ~= nil and effective ~= 0 and want < effective then
         lower("time_limit", effective == INFINITE and "UNLIMITED" or effective, want, " min")
      end
   end

   local nodes = num(job_desc, "min_nodes")
   local multi_node = is_set(nodes, NO_VAL) and nodes > 1
   if multi_node then
      return changes
   end

   -- memory per node (MiB), only an explicit --mem=N
   local mem = num(job_desc, "min_mem_per_node")
   if rec.mem_mib ~= nil and rec.mem_mib >= 1 and type(mem) == "number" and mem > 0
      and mem < NO_VAL and rec.mem_mib < mem then
      lower("min_mem_per_node", mem, rec.mem_mib, " MiB")
   end

   -- CPUs of a single-task job
   local tasks, per_node = num(job_desc, "num_tasks"), num(job_desc, "ntasks_per_node")
   local single = (not is_set(tasks, NO_VAL) or tasks == 1)
      and (not is_set(per_node, NO_VAL16) or per_node == 1)
      and (str(job_desc, "cpus_per_tres") or "") == ""
   local cpus = num(job_desc, "min_cpus")
   local floor = cpu_floor(job_desc, part, rec)
   local new_cpus = rec.cpus
   if new_cpus ~= nil and floor ~= nil and floor > new_cpus then
      new_cpus = floor
   end
   if single and new_cpus ~= nil and new_cpus >= 1 and floor ~= nil and is_set(cpus, NO_VAL)
      and new_cpus < cpus then
      lower("min_cpus", cpus, new_cpus, "")
      local cpt = num(job_desc, "cpus_per_task")
      if is_set(cpt, NO_VAL16) and cpt > new_cpus then
         lower("cpus_per_task", cpt, new_cpus, "")
      end
      local pn = num(job_desc, "pn_min_cpus")
      if is_set(pn, NO_VAL16) and pn > new_cpus then
         lower("pn_min_cpus", pn, new_cpus, "")
      end
   end

   -- GPUs per node, spelling kept
   local mem_per_gpu = (str(job_desc, "mem_per_tres") or "") ~= ""
   if rec.gpus ~= nil and rec.gpus >= 1 and not malleable and not mem_per_gpu then
      local tres = str(job_desc, "tres_per_node")
      local hit = gpu_entry(tres)
      if hit ~= nil and rec.gpus < hit.count then
         local entries = {}
         for i, e in ipairs(hit.entries) do
            entries[i] = e
         end
         entries[hit.index] = hit.head .. show(rec.gpus)
         lower("tres_per_node", tres, table.concat(entries, ","), "")
      end
   end
   return changes
end

-- The first well-formed sgpu:malleable= / sgpu:pool= token ({min, max, pool}), else
-- {bad = the first malformed one}, else nil.
local function malleable_spec(toks)
   local bad = nil
   for _, tok in ipairs(toks) do
      local pool = string.sub(tok, 1, #POOL) == POOL
      if pool or string.sub(tok, 1, #MALLEABLE) == MALLEABLE then
         local lo, hi = string.match(tok, "^[^=]+=(%d+):(%d+)$")
         if lo ~= nil and #lo <= 6 and #hi <= 6 then
            lo, hi = tonumber(lo), tonumber(hi)
            if lo >= 1 and lo <= hi then
               return { min = lo, max = hi, pool = pool }
            end
         end
         bad = bad or tok
      end
   end
   if bad ~= nil then
      return { bad = bad }
   end
   return nil
end

-- Set every planned field; if Slurm refuses one, put back the ones already set.
local function apply(job_desc, changes)
   local done = {}
   local ok, err = pcall(function()
      for _, ch in ipairs(changes) do
         job_desc[ch.field] = ch.new
         done[#done + 1] = ch
      end
   end)
   if not ok then
      for i = #done, 1, -1 do
         pcall(function()
            job_desc[done[i].field] = done[i].orig
         end)
      end
      error(err, 0)
   end
end

local function submit(job_desc, part_list)
   local toks = tokens(str(job_desc, "comment"))
   local want_in, want_out = false, false
   for _, tok in ipairs(toks) do
      if tok == OPT_IN then
         want_in = true
      elseif tok == OPT_OUT then
         want_out = true
      end
   end
   local user = str(job_desc, "user_name")
   local name = str(job_desc, "name")
   local who = "user=" .. tostring(user) .. " name=" .. tostring(name)

   local mspec = malleable_spec(toks)
   if mspec ~= nil then
      if mspec.bad then
         log("malformed malleable token '" .. mspec.bad .. "' (want sgpu:malleable=MIN:MAX "
            .. "or sgpu:pool=MIN:MAX, 1 <= MIN <= MAX) " .. who .. "; token ignored")
         mspec = nil
      elseif mspec.pool then
         log("pool submission " .. who .. " tasks=" .. show(mspec.min) .. ":" .. show(mspec.max)
            .. "; tagged by its comment, request unchanged")
      else
         log("malleable submission " .. who .. " gpus=" .. show(mspec.min) .. ":" .. show(mspec.max)
            .. "; tagged by its comment, request unchanged")
      end
   end

   if not ((want_in or settings.apply_to_all) and not want_out) then
      return
   end

   local pname, part = partition_of(job_desc, part_list)
   local key = nil
   if type(user) ~= "string" or user == "" then
      log("no user name for the job (" .. who .. "); job passed unchanged")
      return
   end
   if type(name) == "string" and name ~= "" and pname ~= nil then
      key = user .. "|" .. name .. "|" .. pname
   end

   local ok, by_key, fallback = pcall(read_recommendations, settings.recommendations_file, key, user)
   if not ok then
      local reason = type(by_key) == "table" and by_key.reason or tostring(by_key)
      log("recommendations unavailable (" .. tostring(reason) .. "); job passed unchanged ("
         .. who .. ")")
      return
   end
   local rec, source = by_key, key
   if rec == nil then
      rec, source = fallback, user
   end
   if rec == nil then
      log("no recommendation for " .. tostring(key or user) .. " (" .. who
         .. "); job passed unchanged")
      return
   end

   -- a pool resizes its concurrency, not its tasks' GPUs: only a malleable job's are kept
   local changes = plan(job_desc, part, rec, mspec ~= nil and not mspec.pool)
   if #changes == 0 then
      log("recommendation " .. source .. " is not below the request (" .. who
         .. "); job passed unchanged")
      return
   end
   local said = {}
   for _, ch in ipairs(changes) do
      said[#said + 1] = ch.field .. " " .. show(ch.old) .. "->" .. show(ch.new) .. ch.unit
   end
   apply(job_desc, changes)
   log("rightsized " .. who .. " from " .. source .. " (" .. show(rec.samples)
      .. " samples): " .. table.concat(said, ", "))
end

-- Set the module's settings (a table: recommendations_file, apply_to_all); returns the
-- module. An unknown name or a value of the wrong type raises: the site's script is wrong.
function M.configure(opts)
   if type(opts) ~= "table" then
      error("slurmgpu.configure: want a table of settings, got a " .. type(opts), 2)
   end
   for k, v in pairs(opts) do
      local want = SETTING_TYPES[k]
      if want == nil then
         error("slurmgpu.configure: unknown setting " .. tostring(k), 2)
      end
      if type(v) ~= want then
         error("slurmgpu.configure: " .. k .. " must be a " .. want .. ", not a " .. type(v), 2)
      end
   end
   for k, v in pairs(opts) do
      settings[k] = v
   end
   return M
end

-- The current settings (a copy), for a site script that logs them.
function M.settings()
   return { recommendations_file = settings.recommendations_file,
            apply_to_all = settings.apply_to_all }
end

-- slurm_job_submit's work: rightsize the job if it opted in. Always slurm.SUCCESS; any
-- failure is one log line and the job unchanged.
function M.job_submit(job_desc, part_list, submit_uid)
   local ok, err = pcall(submit, job_desc, part_list)
   if not ok then
      if type(err) == "table" then
         log("unexpected job request (" .. tostring(err.reason) .. "); job passed unchanged")
      else
         log("internal error (" .. tostring(err) .. "); job passed unchanged")
      end
   end
   return slurm.SUCCESS
end

-- slurm_job_modify's: nothing (a modified job is not rightsized again).
function M.job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return M
