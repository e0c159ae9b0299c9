--[[
slurmgpu job_submit.lua -- the thin script over slurmgpu_submit.lua, for a site without a
job_submit.lua of its own.

INSTALL
  Copy this file and slurmgpu_submit.lua next to slurm.conf (job_submit/lua loads
  "job_submit.lua" from the directory of slurm.conf), set JobSubmitPlugins=lua, and edit
  the two site settings below. slurmctld reloads this script by itself when it changes (no
  restart); after replacing slurmgpu_submit.lua, touch this file so it is reloaded too.

  A site that already has a job_submit.lua keeps it and calls the module from it instead
  of installing this file: see slurmgpu_submit.lua (USE) and docs/admin-guide.md.

  The module is looked up next to this script first, then on Lua's package.path. If it
  cannot be loaded, slurmctld logs one "slurmgpu: ..." line and every job passes unchanged.
  What the module does (opt-in tokens, what is lowered, the recommendations file,
  failures) is described at the top of slurmgpu_submit.lua.
--]]

-- ------------------------------------------------------------------ site settings
-- The TSV the daemon writes (its JSON export path with the suffix .tsv).
local RECOMMENDATIONS_FILE = "/etc/slurmgpu/recommendations.tsv"
-- true: rightsize every job that does not carry sgpu:norightsize.
local apply_to_all = false
-- ------------------------------------------------------------------

-- The directory of this script ("@/etc/slurm/job_submit.lua" -> "/etc/slurm"), or nil.
local function script_dir()
   if type(debug) ~= "table" or type(debug.getinfo) ~= "function" then
      return nil
   end
   local info = debug.getinfo(1, "S") -- this function, defined in this file
   if type(info) == "table" and type(info.source) == "string" then
      return string.match(info.source, "^@(.+)/[^/]*$")
   end
   return nil
end

local dir = script_dir()
if dir ~= nil and not string.find(dir, "[;?]") then
   package.path = dir .. "/?.lua;" .. package.path
end

local loaded, slurmgpu = pcall(require, "slurmgpu_submit")
local configured, why = false, slurmgpu
if loaded then
   configured, why = pcall(slurmgpu.configure, {
      recommendations_file = RECOMMENDATIONS_FILE,
      apply_to_all = apply_to_all,
   })
end

if configured then
   function slurm_job_submit(job_desc, part_list, submit_uid)
      return slurmgpu.job_submit(job_desc, part_list, submit_uid)
   end

   function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
      return slurmgpu.job_modify(job_desc, job_rec, part_list, modify_uid)
   end
else
   local text = "slurmgpu: cannot load slurmgpu_submit.lua ("
      .. string.gsub(tostring(why), "%c", "?") .. "); every job passes unchanged"
   pcall(slurm.log_info, "%s", text)

   function slurm_job_submit(job_desc, part_list, submit_uid)
      return slurm.SUCCESS
   end

   function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
      return slurm.SUCCESS
   end
end

return slurm.SUCCESS
